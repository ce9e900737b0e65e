"""HostRoot: the one place host paths are turned into paths this process can open.

The host's root filesystem is mounted somewhere in the container (``/root`` in
the pod, ``/`` when run by hand, a fixture directory in CI). Host paths are
always written as the host sees them (``/etc/os-release``) and resolved here,
with chroot semantics: absolute symlinks restart at the host root and ``..``
never climbs above it, so nothing on the host can point us outside it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from installer.errors import UsageError

_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)


class HostRoot:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"HostRoot({str(self.root)!r})"

    def path(self, host_path: str | PurePosixPath) -> Path:
        """The container path of ``host_path`` without following symlinks.

        A path that climbs above ``/`` with ``..`` is refused: it is a bug or
        bad input, never something a host layout needs.
        """
        parts: list[str] = []
        for part in PurePosixPath("/", host_path).parts[1:]:
            if part == "..":
                if not parts:
                    raise UsageError(
                        f"host path {str(host_path)!r} escapes the host root",
                        hint="give a path inside the host root",
                        path=str(host_path),
                    )
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return self.root.joinpath(*parts)

    def resolve(self, host_path: str | PurePosixPath) -> Path:
        """The container path of ``host_path`` with symlinks followed inside the root."""
        return self.root.joinpath(*self._resolve_parts(PurePosixPath("/", host_path)).parts[1:])

    def host_view(self, container_path: Path) -> PurePosixPath:
        """The host's name for a container path under the root (inverse of ``path``)."""
        rel = Path(container_path).resolve().relative_to(self.root)
        return PurePosixPath("/", rel.as_posix())

    def _resolve_parts(self, host_path: PurePosixPath) -> PurePosixPath:
        pending = list(host_path.parts[1:])
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = self.root.joinpath(*resolved, part)
            if candidate.is_symlink():
                hops += 1
                if hops > _MAX_SYMLINKS:
                    raise UsageError(
                        f"too many symlinks resolving host path {str(host_path)!r}",
                        path=str(host_path),
                    )
                target = PurePosixPath(os.readlink(candidate))
                if target.is_absolute():
                    resolved = []
                pending = list(target.parts[1:] if target.is_absolute() else target.parts) + pending
            else:
                resolved.append(part)
        return PurePosixPath("/", *resolved)

    def exists(self, host_path: str | PurePosixPath) -> bool:
        return self.resolve(host_path).exists()

    def read_text(self, host_path: str | PurePosixPath, default: str | None = None) -> str | None:
        try:
            return self.resolve(host_path).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return default

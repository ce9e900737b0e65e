"""cos-gpu-installer v2's build tools cache, reused when ours is not there.

v2 (cos/tools ``src/pkg/cos/cos.go`` L21-22, L72-113; ``-prepare-build-tools``)
extracts the toolchain and ``kernel-headers.tgz`` straight into
``/build/cos-tools``: ``bin/``, ``usr/…`` and ``usr/src/linux-headers-<release>/``
at the top of the host's ``/var/lib/cos-tools``, with no record of the build.
We keep ours per build (``<tools>/<BUILD_ID>/``, toolchain.py). When ours is
missing and v2's has the compiler our toolchain_env names and the headers of
the running kernel, we build with v2's instead of downloading ~1 GB again.
Only its ``bin/ld`` may be linked to the cross linker (as in ours); whatever is missing
is fetched into our own layout, never into theirs.
"""

from __future__ import annotations

from pathlib import Path

from installer.base.dataclass import dataclass
from installer.distros.cos.toolchain import BuildTools, compiler_path


@dataclass(frozen=True)
class V2BuildTools(BuildTools):
    """v2's flat layout seen through our BuildTools interface (read-only)."""

    kernel_release: str = ""

    @property
    def root(self) -> Path:
        return self.tools_dir

    @property
    def toolchain(self) -> Path:
        return self.tools_dir

    @property
    def headers(self) -> Path:
        return self.tools_dir

    def toolchain_ready(self, cc: str, sha256: str | None = None) -> bool:
        # No archive record: it cannot match a pinned checksum.
        return sha256 is None and compiler_path(self.tools_dir, cc).exists()

    def headers_ready(self, sha256: str | None = None) -> bool:
        tree = self.tools_dir / "usr/src" / f"linux-headers-{self.kernel_release}"
        return sha256 is None and (tree / "Makefile").is_file()


def adopt(ours: BuildTools, kernel_release: str, cc: str, *, pinned: bool) -> BuildTools:
    """``ours`` when it is ready (or checksums are pinned), else v2's when it is complete."""
    if pinned or (ours.toolchain_ready(cc) and ours.headers_ready()):
        return ours
    theirs = V2BuildTools(ours.tools_dir, ours.build_id, kernel_release)
    return theirs if theirs.toolchain_ready(cc) and theirs.headers_ready() else ours

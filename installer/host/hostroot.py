"""HostRoot: the one place host paths are turned into paths this process can open.

The host's root filesystem is mounted somewhere in the container (``/root`` in
the pod, ``/`` when run by hand, a fixture directory in CI). Host paths are
always written as the host sees them (``/etc/os-release``) and resolved here,
with chroot semantics: absolute symlinks restart at the host root and ``..``
never climbs above it, so nothing on the host can point us outside it.

Reads and writes share one resolver (``_walk``): it opens each directory
relative to the previous one with ``O_NOFOLLOW`` and follows symlinks itself,
so a link swapped in by another host user mid-walk is resolved inside the root
too, and the final operation (create, rename, unlink) happens relative to the
directory's file descriptor, not by a path the kernel would resolve again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from installer.base.errors import UnsupportedHostError, UsageError
from installer.base.fsutil import (
    UnreadableFile,
    exchange,
    new_temp_file,
    read_limited,
    read_regular,
)

_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Host config files are small; anything bigger is not what we are looking for.
MAX_HOST_FILE = 1 << 20


class HostRoot:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"HostRoot({str(self.root)!r})"

    def path(self, host_path: str | PurePosixPath) -> Path:
        """The container path of ``host_path`` without following symlinks (for display).

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

    def host_view(self, container_path: Path) -> PurePosixPath:
        """The host's name for a container path under the root (inverse of ``path``)."""
        rel = Path(container_path).resolve().relative_to(self.root)
        return PurePosixPath("/", rel.as_posix())

    # -- the resolver

    def _walk(self, host_path: PurePosixPath, *, create: bool = False,
              ) -> tuple[int | None, list[str]]:
        """Open the directory ``host_path`` names; returns (fd, its resolved host parts).

        Missing directories are made (0755) with ``create``; otherwise (and for a
        file where a directory should be) the fd is None and the parts end with
        the unresolved rest, taken literally.
        The caller closes the fd.
        """
        pending = [p for p in host_path.parts if p != "/"]
        try:
            fds = [os.open(self.root, _DIR_FLAGS)]
        except (FileNotFoundError, NotADirectoryError):
            if create:
                raise
            return None, _literal([], pending)  # a wrong --host-root: reads find nothing
        names: list[str] = []
        hops = 0
        try:
            while pending:
                part = pending.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":
                    if names:
                        os.close(fds.pop())
                        names.pop()
                    continue
                try:
                    fd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fds[-1])
                except FileNotFoundError:
                    if not create:
                        return None, _literal(names, [part, *pending])
                    hops = self._hop(hops, host_path)  # bounds a create/delete race too
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fds[-1])
                    pending.insert(0, part)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    target = _link_target(part, fds[-1], names, create)
                    if target is None:
                        return None, _literal(names, [part, *pending])
                    hops = self._hop(hops, host_path)
                    if target.startswith("/"):  # from the root again
                        for _ in fds[1:]:
                            os.close(fds.pop())
                        names = []
                    pending = [p for p in PurePosixPath(target).parts if p != "/"] + pending
                    continue
                fds.append(fd)
                names.append(part)
            return fds.pop(), names
        finally:
            for fd in fds:
                os.close(fd)

    def _hop(self, hops: int, host_path: PurePosixPath) -> int:
        if hops >= _MAX_SYMLINKS:
            raise UsageError(f"too many symlinks resolving host path {str(host_path)!r}",
                             path=str(host_path))
        return hops + 1

    def _locate(self, host_path: str | PurePosixPath, *, create_parents: bool = False,
                follow: bool = True) -> tuple[int | None, list[str], str]:
        """(fd of the parent dir or None if it is missing, the parent's parts, the name).

        With ``follow`` a symlink in the last place is followed (inside the root).
        """
        path = PurePosixPath("/", host_path)
        for _ in range(_MAX_SYMLINKS):
            if path.name in ("", ".", ".."):  # "/", "/a/..": the dir itself
                fd, names = self._walk(path, create=create_parents)
                if fd is not None:
                    os.close(fd)
                if not names:
                    raise _RootItself(f"host path {str(host_path)!r} names the host root itself",
                                      path=str(host_path))
                path = PurePosixPath("/", *names)
            fd, names = self._walk(path.parent, create=create_parents)
            target = _readlink(path.name, fd) if (follow and fd is not None) else None
            if target is None or fd is None:  # a target is read only through an fd
                return fd, names, path.name
            os.close(fd)
            path = PurePosixPath(target) if target.startswith("/") else \
                PurePosixPath("/", *names, target)
        raise UsageError(f"too many symlinks resolving host path {str(host_path)!r}",
                         path=str(host_path))

    # -- reads

    def resolve(self, host_path: str | PurePosixPath) -> Path:
        """The container path of ``host_path`` with symlinks followed inside the root."""
        try:
            fd, names, name = self._locate(host_path)
        except _RootItself:
            return self.root
        if fd is not None:
            os.close(fd)
        return self.root.joinpath(*names, name)

    def exists(self, host_path: str | PurePosixPath) -> bool:
        return self.resolve(host_path).exists()

    def read_text(self, host_path: str | PurePosixPath, default: str | None = None,
                  *, max_bytes: int = MAX_HOST_FILE) -> str | None:
        """A small regular host file's text, or ``default`` when it is absent.

        Anything else there (a FIFO, a device, a directory, a huge file) is an
        UnsupportedHostError naming it: never a hang or a memory blow-up.
        """
        try:
            fd, _names, name = self._locate(host_path)
            if fd is None:
                return default
            try:
                data = read_limited(name, max_bytes, dir_fd=fd)
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):
            return default
        except UnreadableFile as exc:
            raise UnsupportedHostError(
                f"the host's {host_path} {exc.reason}",
                hint="it should be a small regular file; check --host-root and the node",
                path=str(host_path),
            ) from None
        return data.decode("utf-8", errors="replace")

    # -- writes (every host write goes through one of these)

    def mkdir(self, host_path: str | PurePosixPath) -> Path:
        """Make the directory and its parents inside the root; returns its container path."""
        fd, names = self._walk(PurePosixPath("/", host_path), create=True)
        assert fd is not None
        os.close(fd)
        return self.root.joinpath(*names)

    def write_atomic(self, host_path: str | PurePosixPath, data: str | bytes,
                     mode: int = 0o644) -> Path:
        """Replace the file's content atomically (temp file, fsync, rename).

        A symlink there is followed inside the root and its target replaced,
        as a shell redirect on the host would: the link stays.
        """
        raw = data.encode() if isinstance(data, str) else data
        fd, names, name = self._locate(host_path, create_parents=True)
        assert fd is not None
        try:
            _replace_in(fd, name, raw, mode)
        finally:
            os.close(fd)
        return self.root.joinpath(*names, name)

    def rewrite_existing(self, host_path: str | PurePosixPath, edit: Callable[[str], str],
                         max_bytes: int = 65536) -> bool:
        """Replace an existing regular file's content with ``edit(content)``, atomically, with
        its mode and owner; True if it was written. Never creates the file: missing (or
        removed before the swap) is False, and so is an unchanged content. The new file is
        swapped in (``fsutil.exchange``), so a file removed meanwhile stays removed, and one
        another writer replaced meanwhile is swapped back and left as that writer made it."""
        try:
            fd, _names, name = self._locate(host_path)
        except (FileNotFoundError, NotADirectoryError):
            return False  # no host root mounted here
        if fd is None:
            return False
        try:
            try:
                old, st = read_regular(name, max_bytes, dir_fd=fd)
            except (FileNotFoundError, UnreadableFile):
                return False
            new = edit(old.decode("utf-8", errors="replace")).encode()
            return new != old and _swap_in(fd, name, new, st)
        finally:
            os.close(fd)

    def unlink(self, host_path: str | PurePosixPath) -> bool:
        """Remove the file (a symlink itself, never what it points to); True if there was one."""
        fd, _names, name = self._locate(host_path, follow=False)
        if fd is None:
            return False
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)
        return True

    def open_parent(self, host_path: str | PurePosixPath) -> tuple[int, str]:
        """(fd of the file's parent dir, made if missing; the file name) for an operation
        that must not follow a link in the last place (the lock). The caller closes fd."""
        fd, _names, name = self._locate(host_path, create_parents=True, follow=False)
        assert fd is not None
        return fd, name


class _RootItself(UsageError):
    """A host path that names ``/`` where a file is meant."""


def _literal(names: list[str], rest: list[str]) -> list[str]:
    out = list(names)
    for part in rest:
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return out


def _readlink(name: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def _link_target(part: str, dir_fd: int, names: list[str], create: bool) -> str | None:
    """Where the symlink ``part`` points; None when it is no symlink (a file where a
    directory should be), which ``create`` refuses (NotADirectoryError)."""
    target = _readlink(part, dir_fd)
    if target is None and create:
        raise NotADirectoryError(errno.ENOTDIR, "not a directory",
                                 str(PurePosixPath("/", *names, part)))
    return target


def _write_temp(dir_fd: int, name: str, raw: bytes, mode: int,
                owner: tuple[int, int] | None = None) -> str:
    """``raw`` in a new temp file beside ``name`` (fsynced, ``mode``, and ``owner`` where
    this process may set it): its name, for the caller to rename or exchange."""
    fd, tmp = new_temp_file(name, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if owner is not None:
                with contextlib.suppress(PermissionError):  # not root: it stays ours
                    os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return tmp


def _replace_in(dir_fd: int, name: str, raw: bytes, mode: int) -> None:
    tmp = _write_temp(dir_fd, name, raw, mode)
    try:
        st = _lstat(name, dir_fd)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", name)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)  # the rename itself survives a crash


def _swap_in(dir_fd: int, name: str, raw: bytes, was: os.stat_result) -> bool:
    """``rewrite_existing``'s write: a temp file like ``was`` (mode, owner) exchanged with
    ``name`` only while ``name`` is still the file ``was`` describes."""
    try:
        tmp = _write_temp(dir_fd, name, raw, stat.S_IMODE(was.st_mode),
                          owner=(was.st_uid, was.st_gid))
    except FileNotFoundError:
        return False  # the directory went meanwhile: nothing brought back
    try:
        return _exchange_if_same(dir_fd, tmp, name, was)
    except FileNotFoundError:
        return False  # removed meanwhile: not brought back
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)


def _exchange_if_same(dir_fd: int, tmp: str, name: str, was: os.stat_result) -> bool:
    if not exchange(tmp, name, dir_fd):  # no renameat2 here: check, then rename
        st = _lstat(name, dir_fd)
        if st is None or st.st_ino != was.st_ino:
            return False
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    if os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False).st_ino != was.st_ino:
        exchange(tmp, name, dir_fd)  # another writer's file came meanwhile: put it back
        return False
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)
    return True


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None

"""Taking files out of what a jail wrote, never through a link it left (docs/jail.md).

What NVIDIA's code wrote (the overlay's upper dir, the extracted tree) is read and moved
by us, outside the jail, as root: a link it planted where a directory is expected would
send a move or a read anywhere the container sees (the host root at /root). So every
path is opened one component at a time with O_NOFOLLOW from a directory we hold, and
only regular files, directories and links that stay inside the moved tree are taken;
anything else (a link out, a device, a FIFO, a socket) is refused, and the install
with it.

What is taken gets modes we choose, not the jail's (``chosen_mode``): 0755 for what has an
execute bit and for dirs, 0644 for the rest; never setuid, setgid, sticky or
world-writable. NVIDIA's own installer makes nvidia-modprobe setuid root
(NVIDIA/nvidia-modprobe nvidia-modprobe.c: "a small setuid utility for loading the NVIDIA
kernel module and creating NVIDIA device files"); here it is not: this installer runs it
as root itself to make every device file (devnodes.py, the activate step) before a
workload starts, and the install dir is a hostPath mounted into GPU pods, where a
setuid-root binary would hand root to any process that can exec it.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from pathlib import Path

from installer.jail.visible import visible

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 32  # NVIDIA's deepest harvested dir is 2 below its top
COPY_CHUNK = 1 << 20
# What the jail printed is read only as its last bytes: a jail printing 200 MiB must not
# take the installer's memory with it (docs/jail.md, J5); its errors are at the end.
TAIL_BYTES = 256 << 10


class Refused(Exception):
    """An entry the jail left that we will not take (``where`` names it in the jail)."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(visible(f"{where} is {what}"))  # names the jail chose


def _kind(mode: int) -> str:
    kinds = {stat.S_IFLNK: "a link", stat.S_IFCHR: "a character device",
             stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
             stat.S_IFREG: "a file", stat.S_IFDIR: "a directory"}
    return kinds.get(stat.S_IFMT(mode), "not a file")


def _sub_dir(parent: int, name: str, where: str) -> int:
    """An fd of the directory ``name`` in the dir ``parent``; Refused if it is not one."""
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(where, _kind(st.st_mode))
    return os.open(name, DIR_FLAGS, dir_fd=parent)  # O_NOFOLLOW: swapped for a link, ELOOP


def open_dir(root: Path | str, rel: str = "") -> int:
    """An fd of the directory ``rel`` below ``root`` (ours), no link followed on the way:
    FileNotFoundError when it is absent, Refused (naming ``/<rel>``, the jail's path)
    when a part of it is not a directory."""
    fd = os.open(root, DIR_FLAGS)
    where = ""
    try:
        for part in filter(None, rel.split("/")):
            where = f"{where}/{part}"
            sub = _sub_dir(fd, part, where)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_owned(fd: int, where: str) -> None:
    """Refused unless the directory ``fd`` is owned by us (the staging dirs we made)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise Refused(where, f"owned by uid {st.st_uid}, not by us")


def chosen_mode(mode: int) -> int:
    """The mode a harvested file gets: 0755 when the jail left any execute bit, else
    0644 (no setuid, setgid, sticky or group/world-writable bit survives)."""
    return 0o755 if mode & 0o111 else 0o644


def _take_file(name: str, src: int, dst: int) -> None:
    """Move the regular file ``name`` from dir ``src`` to dir ``dst`` with a mode we chose
    (set on the open file, before the move: never through a path a link could swap)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(name, _kind(st.st_mode))
        os.fchmod(fd, chosen_mode(st.st_mode))
    finally:
        os.close(fd)
    os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)


def _is_whiteout(st: os.stat_result) -> bool:
    """overlayfs's mark of a deleted lower file: nothing to take."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _link_stays_inside(target: str, rel_dir: str) -> bool:
    """A relative link that, read from ``rel_dir`` (the link's dir in the moved tree),
    names something inside that tree: NVIDIA's soname links (``libcuda.so.1 ->
    libcuda.so.550.54.14``, ``gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1``)."""
    if target.startswith("/"):
        return False
    resolved = posixpath.normpath(posixpath.join(rel_dir, target))
    return resolved != ".." and not resolved.startswith("../")


def _make_dir(name: str, dst: int) -> None:
    """The dir ``name`` in ``dst``, 0755 whatever the umask (an existing one is checked
    to be a dir where it is opened)."""
    try:
        os.mkdir(name, 0o755, dir_fd=dst)
    except FileExistsError:
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dst)
    try:
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)


def move_tree(src: int, dst: int, where: str, rel_dir: str = "", depth: int = 0) -> int:
    """Move everything under the dir ``src`` into the dir ``dst`` (both fds, kept open by
    the caller), keeping sub-dirs; whiteouts are skipped. The count of entries moved."""
    if depth > MAX_DEPTH:
        raise Refused(where, f"more than {MAX_DEPTH} directories deep")
    count = 0
    for name in sorted(os.listdir(src)):
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
        here = f"{where}/{name}"
        if stat.S_ISDIR(st.st_mode):
            _make_dir(name, dst)
            sub_src = os.open(name, DIR_FLAGS, dir_fd=src)
            try:
                sub_dst = _sub_dir(dst, name, f"{where} (destination)")
            except BaseException:
                os.close(sub_src)
                raise
            try:
                count += move_tree(sub_src, sub_dst, here, posixpath.join(rel_dir, name),
                                   depth + 1)
            finally:
                os.close(sub_src)
                os.close(sub_dst)
        elif _is_whiteout(st):
            continue
        elif stat.S_ISREG(st.st_mode):
            _take_file(name, src, dst)
            count += 1
        elif stat.S_ISLNK(st.st_mode) and _link_stays_inside(os.readlink(name, dir_fd=src),
                                                             rel_dir):
            os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)  # moves a link, never follows
            count += 1
        elif stat.S_ISLNK(st.st_mode):
            raise Refused(here, f"a link out of its tree (to {os.readlink(name, dir_fd=src)!r})")
        else:
            raise Refused(here, _kind(st.st_mode))
    return count


def move_files(root: Path, rel: str, names: tuple[str, ...], dest: Path) -> list[str]:
    """Move the regular files ``names`` from the dir ``rel`` below ``root`` into ``dest``
    (ours); those moved, in ``names``' order. Refused when one is anything else."""
    moved = []
    src = open_dir(root, rel)
    try:
        dst = open_dir(dest)
        try:
            for name in names:
                try:
                    st = os.stat(name, dir_fd=src, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    raise Refused(f"/{rel}/{name}", _kind(st.st_mode))
                _take_file(name, src, dst)
                moved.append(name)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return moved


def _open_file(root: Path | str, rel: str) -> int | None:
    """A read-only fd of the regular file ``rel`` below ``root``, through no link; None
    when it is absent, Refused when it is anything else."""
    parent, _, name = rel.rpartition("/")
    try:
        dir_fd = open_dir(root, parent)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"/{rel}", "a link") from None
        raise
    finally:
        os.close(dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Refused(f"/{rel}", _kind(mode))
    return fd


def read_head(root: Path, rel: str, max_bytes: int) -> bytes | None:
    """The first ``max_bytes`` of the regular file ``rel`` below ``root``, through no
    link; None when it is absent or anything but a regular file."""
    try:
        fd = _open_file(root, rel)
    except Refused:
        return None
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes)


def copy_regular(root: Path | str, rel: str, dest: Path) -> bool:
    """Copy the regular file ``rel`` below ``root`` to ``dest`` (ours) through no link;
    False when it is absent, Refused when it is anything but a regular file."""
    fd = _open_file(root, rel)
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as src, open(dest, "wb") as out:
        while chunk := src.read(COPY_CHUNK):
            out.write(chunk)
    return True


def read_tail(path: Path, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``max_bytes`` of ``path`` as text ("" when it is absent), its first,
    likely cut, line dropped when the file is longer."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except (FileNotFoundError, IsADirectoryError):
        return ""
    text = data.decode(errors="replace")
    return text.partition("\n")[2] if size > max_bytes else text

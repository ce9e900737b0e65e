"""Small filesystem helpers: atomic writes, bounded reads and hashing."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

HASH_CHUNK = 1 << 20


def sorted_entries(path: Path) -> list[Path]:
    """The entries of directory ``path``, sorted; none when it is missing or unreadable
    (sysfs dirs a node lacks: no such bus, class or module)."""
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 100


def new_temp_file(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> tuple[int, str]:
    """A new file ``.<name>.<random>.tmp`` beside ``path`` (relative to ``dir_fd`` when
    given), as tempfile.mkstemp makes one: created by this call (O_EXCL), no link followed,
    mode 0600 until written; another random name when one is taken. Returns (fd, its path).

    The name is random, not the pid: in a container's PID namespace every run has the same
    pid, so a killed run's leftover would block each later run. os.urandom, as
    secrets.token_hex reads it; not tempfile itself, which imports shutil, bz2 and lzma,
    ~4 ms of every cache hit's start-up, which writes its records through here."""
    head, name = os.path.split(os.fspath(path))
    for _ in range(_TEMP_TRIES):
        tmp = os.path.join(head, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {name}", head or ".")


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write via a temp file in the same dir, fsync, rename: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = new_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_record(path: Path, data: str | bytes) -> None:
    """``write_atomic`` for the install dir's own records (``.cache``, ``status.json``).

    rename(2) replaces a symlink (even a loop), FIFO or device itself, never what it
    names; a directory in the way would fail every install from then on, so it goes
    first (records live only in the install dir: nothing of the host's is removed).
    """
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    write_atomic(path, data)


class UnreadableFile(Exception):
    """A file we read is not a small regular file (``reason`` says what it is instead)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a message ("a FIFO", "a directory", ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_limited(path: str | os.PathLike[str], max_bytes: int, *, dir_fd: int | None = None,
                 ) -> bytes:
    """The content of a regular file of at most ``max_bytes``; UnreadableFile otherwise.

    Opened non-blocking, so a FIFO planted where a config file should be is
    refused instead of hanging the run; a device or a huge file is refused
    before anything is read into memory. FileNotFoundError passes through.
    """
    return read_regular(path, max_bytes, dir_fd=dir_fd)[0]


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, dir_fd: int | None = None,
                 ) -> tuple[bytes, os.stat_result]:
    """``read_limited``, with the file's stat (from the same open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except IsADirectoryError:
        raise UnreadableFile("is a directory, not a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"is {file_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise UnreadableFile(f"is {st.st_size} bytes, more than the {max_bytes} allowed")
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:  # grew while we read
            raise UnreadableFile(f"is more than the {max_bytes} bytes allowed")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(f: BinaryIO) -> str:
    # hashlib loads OpenSSL's libcrypto (~5-7 ms): a cache hit checks files by stat and
    # hashes none unless one changed, so the first hash pays for it.
    import hashlib

    digest = hashlib.sha256()
    while chunk := f.read(HASH_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def open_beneath(root: Path, rel: str) -> int:
    """A read-only fd of ``rel`` (a clean relative path) under ``root``, following no
    symlink below ``root``: each directory is opened O_NOFOLLOW relative to the last,
    so a link anywhere in ``rel`` is ELOOP or ENOTDIR, never followed. Non-blocking, so a
    FIFO opens at once (the caller fstats what it got)."""
    *dirs, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = sub
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    finally:
        os.close(fd)


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """Remove a file, link or directory tree (absent is fine). ``ignore_errors``: for
    clean-up on a failure path, where a second error must not hide the first."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        # Directories extracted read-only must be writable to be removed.
        for dirpath, _dirs, _files in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(dirpath, 0o700)
        import shutil  # (and bz2, lzma, zlib with it) not on a cache hit

        shutil.rmtree(path, ignore_errors=ignore_errors)


RENAME_EXCHANGE = 2  # include/uapi/linux/fs.h (Linux 3.15; tmpfs, ext4, xfs, overlayfs)


def exchange(name_a: str, name_b: str, dir_fd: int) -> bool:
    """Swap two names in one directory atomically (renameat2 with RENAME_EXCHANGE): both
    must exist, so a file removed meanwhile is never brought back. FileNotFoundError when
    one is gone; False where the kernel, the file system or the C library cannot do it."""
    import ctypes  # a staged install's promotion only, not a cache hit

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28
    if renameat2 is None:
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint)
    if renameat2(dir_fd, os.fsencode(name_a), dir_fd, os.fsencode(name_b),
                 RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), name_b)

"""The host-wide installer lock: the same flock GKE's installers take.

Held for the whole run so this installer, GKE's COS and Ubuntu installers and
a second copy of ourselves never work on one node at once.

The lock file sits in the host's world-writable ``/tmp``, so any local user
can plant something there first. Privileges are checked before it is touched: a
run that is not root leaves nothing there (it once left a lock of its own that
every later root run refused). It is opened relative to its directory with
``O_NOFOLLOW``; when it is anything but a regular file owned by us with a single
link (a symlink, a FIFO, another user's file, a hard link) and no live process
holds a flock on it (/proc/locks), it is taken over: a fresh file of ours is
renamed over the entry, which replaces it and never follows it. One held by a
live process is refused. It is only rewritten (our PID) when it holds nothing
but a PID: we never truncate a file another user made.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path, PurePosixPath

import structlog

from installer.base.errors import (
    PRIVILEGES_HINT,
    InstallerError,
    LockHeldError,
    UsageError,
    from_os_error,
)
from installer.host.hostroot import HostRoot

log = structlog.get_logger(__name__)

LOCK_HOST_PATH = "/tmp/cos_gpu_installer_lock"
_POLL_S = 0.2
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ATTEMPTS = 5  # the lock file replaced under us between open and flock: open it again


def holder_pid(fd: int, proc_dir: Path = Path("/proc")) -> int | None:
    """PID holding a flock on the open lock file, from /proc/locks; None when it does not
    show one (0: a holder outside our PID namespace). Never the PID written in the file: a
    killed run's, or pid 1 of another pod's namespace, names a process that is not there."""
    try:
        ino = os.fstat(fd).st_ino
        for line in (proc_dir / "locks").read_text().splitlines():
            fields = line.split()
            # 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
            if len(fields) >= 6 and fields[1] == "FLOCK":
                major_minor_inode = fields[5].split(":")
                if len(major_minor_inode) == 3 and int(major_minor_inode[2]) == ino:
                    return int(fields[4]) or None
    except (OSError, ValueError):
        pass
    return None


def flock_held(st: os.stat_result, proc_dir: Path = Path("/proc")) -> bool:
    """Whether /proc/locks shows a flock on the file ``st`` describes (device and inode),
    whoever holds it, in any PID namespace; unreadable: assumed held."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        text = (proc_dir / "locks").read_text()
    except OSError:
        return True
    return any(len(f) >= 6 and f[1] == "FLOCK" and f[5] == dev
               for f in (line.split() for line in text.splitlines()))


def _holds_only_a_pid(fd: int) -> bool:
    text = _content(fd)
    return os.fstat(fd).st_size <= 32 and (not text.strip() or text.strip().isdigit())


def _content(fd: int) -> str:
    try:
        return os.pread(fd, 64, 0).decode(errors="replace")
    except OSError:
        return ""


def _unprivileged(exc: OSError) -> InstallerError | None:
    """Not root: say so (as root, EACCES here is a planted file or protected_symlinks)."""
    return from_os_error(exc) if os.geteuid() != 0 or exc.errno == errno.EROFS else None


class HostLock:
    """``with HostLock(host): ...`` holds the host lock (``path`` is a host path)."""

    def __init__(self, host: HostRoot, timeout_s: float = 0.0,
                 path: str | PurePosixPath = LOCK_HOST_PATH) -> None:
        self.host = host
        self.host_path = str(path)
        self.path = host.path(path)  # for messages
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def _refuse(self, problem: str) -> LockHeldError:
        return LockHeldError(
            f"refusing the host lock {self.host_path}: {problem}",
            hint=f"another user may have planted it: check and remove {self.host_path} on the "
            "node, then re-run",
            path=self.host_path,
        )

    def _open(self) -> tuple[int, bool]:
        """(fd of the lock file, whether we created it)."""
        try:
            dir_fd, name = self.host.open_parent(self.host_path)
        except OSError as exc:
            exc.filename = self.host_path
            raise (_unprivileged(exc) or self._refuse(
                f"cannot open its directory: {exc.strerror or exc}")) from None
        try:
            try:
                return os.open(name, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644,
                               dir_fd=dir_fd), True
            except FileExistsError:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if self._problem(st) is None:
                    fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
                    if (problem := self._problem(os.fstat(fd))) is not None:
                        os.close(fd)  # swapped between our stat and our open
                        raise self._refuse(problem) from None
                    return fd, False
                return self._take_over(dir_fd, name, st), True
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse("it is a symlink") from None
            exc.filename = self.host_path  # not the bare name opened relative to /tmp
            raise (_unprivileged(exc) or self._refuse(exc.strerror or str(exc))) from None
        finally:
            os.close(dir_fd)

    @staticmethod
    def _problem(st: os.stat_result) -> str | None:
        """Why the entry ``st`` describes is not a lock file of ours (None when it is)."""
        if stat.S_ISLNK(st.st_mode):
            return "it is a symlink"
        if not stat.S_ISREG(st.st_mode):
            return "it is not a regular file"
        if st.st_uid != os.geteuid():
            return f"it is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
        if st.st_nlink != 1:
            return f"it has {st.st_nlink} hard links"
        return None

    def _take_over(self, dir_fd: int, name: str, st: os.stat_result) -> int:
        """A fresh lock file of ours renamed over ``name`` (the entry replaced, whatever it
        is, never followed or written), when no live process holds a flock on it."""
        problem = self._problem(st)
        if flock_held(st):
            raise self._refuse(f"{problem}, and a live process holds a lock on it")
        temp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"  # = secrets.token_hex(4)
        fd = os.open(temp, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        try:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            os.close(fd)
            os.unlink(temp, dir_fd=dir_fd)
            raise self._refuse(f"{problem}; it cannot be replaced: {exc.strerror}") from None
        log.warning("lock_file_replaced", path=self.host_path, reason=problem,
                    hint="no process held it: a planted or stale file, replaced (not followed)")
        return fd

    def _still_ours(self, fd: int) -> bool:
        """Whether the lock's path still names the file ``fd`` is (another run may have
        replaced it between our open and our flock)."""
        try:
            dir_fd, name = self.host.open_parent(self.host_path)
        except OSError:
            return False
        try:
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False
        finally:
            os.close(dir_fd)
        held = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def __enter__(self) -> HostLock:
        if os.geteuid() != 0:  # before the lock file is touched: nothing left behind
            raise UsageError(f"permission denied on {self.host_path}: the installer needs "
                             "root privileges", hint=PRIVILEGES_HINT, path=self.host_path)
        for _ in range(_ATTEMPTS):
            fd, created = self._open()
            self._flock(fd)
            if self._still_ours(fd):
                break
            os.close(fd)
        else:
            raise self._refuse(f"it was replaced under us {_ATTEMPTS} times")
        if created or _holds_only_a_pid(fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _flock(self, fd: int) -> None:
        """The flock on ``fd``, waiting up to the timeout; LockHeldError after it."""
        deadline = time.monotonic() + max(self.timeout_s, 0.0)
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    pid = holder_pid(fd)
                    os.close(fd)
                    who = f" (pid {pid})" if pid else " (its PID is not visible from here)"
                    raise LockHeldError(
                        f"another installer holds the host lock {self.path}{who}",
                        hint="wait for it to finish, or pass --lock-timeout SECONDS to wait",
                        path=str(self.path),
                        holder_pid=pid,
                    ) from None
                if not waited:
                    log.info("lock_waiting", path=str(self.path), holder_pid=holder_pid(fd),
                             timeout_s=self.timeout_s)
                    waited = True
                time.sleep(_POLL_S)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None

"""The host-wide installer lock: the same flock GKE's installers take.

Held for the whole run so this installer, GKE's COS and Ubuntu installers and
a second copy of ourselves never work on one node at once.

The lock file sits in the host's world-writable ``/tmp``, so any local user
can plant something there first. It is opened relative to its directory with
``O_NOFOLLOW`` (a symlink is refused, never followed), must be a regular file
owned by us with a single link, and is only rewritten (our PID) when it
holds nothing but a PID: we never truncate a file another user made.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path, PurePosixPath

import structlog

from installer.errors import InstallerError, LockHeldError, from_os_error
from installer.hostroot import HostRoot

log = structlog.get_logger(__name__)

LOCK_HOST_PATH = "/tmp/cos_gpu_installer_lock"
_POLL_S = 0.2
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
                return os.open(name, _OPEN_FLAGS, dir_fd=dir_fd), False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse("it is a symlink") from None
            exc.filename = self.host_path  # not the bare name opened relative to /tmp
            raise (_unprivileged(exc) or self._refuse(exc.strerror or str(exc))) from None
        finally:
            os.close(dir_fd)

    def _check(self, fd: int) -> None:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "it is not a regular file"
        elif st.st_uid != os.geteuid():
            problem = f"it is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
        elif st.st_nlink != 1:
            problem = f"it has {st.st_nlink} hard links"
        if problem:
            os.close(fd)
            raise self._refuse(problem)

    def __enter__(self) -> HostLock:
        fd, created = self._open()
        self._check(fd)
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
        if created or _holds_only_a_pid(fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None

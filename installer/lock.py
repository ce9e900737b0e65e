"""The host-wide installer lock: the same flock GKE's installers take.

Held for the whole run so this installer, GKE's COS and Ubuntu installers and
a second copy of ourselves never work on one node at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

import structlog

from installer.errors import LockHeldError

log = structlog.get_logger(__name__)

LOCK_HOST_PATH = "/tmp/cos_gpu_installer_lock"
_POLL_S = 0.2


def holder_pid(lock_path: Path, proc_dir: Path = Path("/proc")) -> int | None:
    """PID holding a flock on ``lock_path``, from /proc/locks, else the PID we record."""
    try:
        st = lock_path.stat()
        for line in (proc_dir / "locks").read_text().splitlines():
            fields = line.split()
            # 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
            if len(fields) >= 6 and fields[1] == "FLOCK":
                major_minor_inode = fields[5].split(":")
                if len(major_minor_inode) == 3 and int(major_minor_inode[2]) == st.st_ino:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    try:
        text = lock_path.read_text().strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


class HostLock:
    def __init__(self, path: Path, timeout_s: float = 0.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def __enter__(self) -> HostLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
                    pid = holder_pid(self.path)
                    os.close(fd)
                    who = f" (pid {pid})" if pid else ""
                    raise LockHeldError(
                        f"another installer holds the host lock {self.path}{who}",
                        hint="wait for it to finish, or pass --lock-timeout SECONDS to wait",
                        path=str(self.path),
                        holder_pid=pid,
                    ) from None
                if not waited:
                    log.info("lock_waiting", path=str(self.path), holder_pid=holder_pid(self.path),
                             timeout_s=self.timeout_s)
                    waited = True
                time.sleep(_POLL_S)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None

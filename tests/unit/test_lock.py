import subprocess
import sys
import time

import pytest

from installer.errors import LockHeldError
from installer.lock import HostLock, holder_pid

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def holder(tmp_path):
    """A real other process holding the flock, as GKE's installer would (no PID written)."""
    lock = tmp_path / "tmp/cos_gpu_installer_lock"
    lock.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), "1.0"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield lock, proc
    proc.kill()
    proc.wait()


def test_second_installer_fails_at_once_naming_holder(holder):
    lock, proc = holder
    start = time.monotonic()
    with pytest.raises(LockHeldError) as err, HostLock(lock, timeout_s=0):
        pass
    assert time.monotonic() - start < 0.5
    assert f"(pid {proc.pid})" in err.value.message
    assert err.value.exit_code == 4
    assert holder_pid(lock) == proc.pid


def test_waits_with_timeout_then_gets_lock(holder):
    lock, proc = holder
    with HostLock(lock, timeout_s=10) as held:
        assert proc.poll() is not None  # holder finished first
        assert lock.read_text().strip().isdigit()
    assert held._fd is None


def test_lock_released_on_exit(tmp_path):
    lock = tmp_path / "l"
    with HostLock(lock):
        pass
    with HostLock(lock):
        pass

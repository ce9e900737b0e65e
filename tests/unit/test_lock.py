import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from installer.base.errors import LockHeldError
from installer.host.hostroot import HostRoot
from installer.host.lock import HostLock, holder_pid

# Holds the flock until the test closes its stdin (or, at the latest, after 120 s), so no
# assertion races a fixed hold time on a loaded machine.
HOLD = """
import fcntl, os, select, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
select.select([sys.stdin], [], [], 120)
"""
DEADLINE_S = 30


@pytest.fixture
def host(tmp_path):
    (tmp_path / "tmp").mkdir()
    return HostRoot(tmp_path)


@pytest.fixture
def holder(host):
    """A real other process holding the flock, as GKE's installer would (no PID written)."""
    lock = host.root / "tmp/cos_gpu_installer_lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"  # the holder ends after 120 s anyway
    yield lock, proc
    proc.kill()
    proc.wait()


def release_soon(proc: subprocess.Popen[str]) -> threading.Thread:
    """The holder lets go once the test is waiting for the lock (its stdin closed)."""
    thread = threading.Thread(target=lambda: (time.sleep(0.5), proc.stdin.close()))
    thread.start()
    return thread


def test_second_installer_fails_at_once_naming_holder(host, holder):
    lock, proc = holder
    start = time.monotonic()
    with pytest.raises(LockHeldError) as err, HostLock(host, timeout_s=0):
        pass
    # At once: it did not wait for the holder, which holds until we let go (or 120 s).
    assert proc.poll() is None and time.monotonic() - start < DEADLINE_S
    assert f"(pid {proc.pid})" in err.value.message
    assert err.value.exit_code == 4
    fd = os.open(lock, os.O_RDONLY)
    try:
        assert holder_pid(fd) == proc.pid
    finally:
        os.close(fd)


@pytest.mark.parametrize("proc_locks", ["", "1: FLOCK  ADVISORY  WRITE 0 08:01:{ino} 0 EOF\n"],
                         ids=["not-listed", "other-pid-namespace"])
def test_a_pid_written_in_a_stale_lock_file_is_never_named(host, holder, tmp_path, proc_locks):
    lock, _ = holder
    lock.write_text("1\n")  # a killed run's PID, in its own pod's namespace
    proc_dir = tmp_path / "proc"
    proc_dir.mkdir()
    fd = os.open(lock, os.O_RDONLY)
    try:
        (proc_dir / "locks").write_text(proc_locks.format(ino=os.fstat(fd).st_ino))
        assert holder_pid(fd, proc_dir) is None
    finally:
        os.close(fd)


def test_waits_with_timeout_then_gets_lock(host, holder):
    lock, proc = holder
    releaser = release_soon(proc)
    with HostLock(host, timeout_s=DEADLINE_S) as held:
        assert proc.wait(timeout=DEADLINE_S) == 0  # the holder let go first, and ended
        assert lock.read_text().strip().isdigit()
    releaser.join()
    assert held._fd is None


def test_lock_released_on_exit(host):
    with HostLock(host):
        pass
    with HostLock(host):
        pass


def test_symlinked_tmp_resolves_inside_the_host_root(host, tmp_path):
    (host.root / "tmp").rmdir()
    (host.root / "var/tmp").mkdir(parents=True)
    os.symlink("/var/tmp", host.root / "tmp")
    with HostLock(host):
        assert (host.root / "var/tmp/cos_gpu_installer_lock").is_file()


@pytest.mark.parametrize("plant", ["symlink", "dangling", "fifo", "hardlink", "other_owner"])
def test_planted_lock_files_no_one_holds_are_replaced_never_followed(host, tmp_path, plant):
    """Issue 39, the lock trap: a lock file that is not a plain file of ours and that no
    live process holds (a planted link, a FIFO, a hard link to a victim, another user's
    file, such as a non-root run once left) is replaced by a fresh file of ours: its entry
    renamed over, what it names never opened, written or truncated."""
    lock = host.root / "tmp/cos_gpu_installer_lock"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if plant == "symlink":
        os.symlink(victim, lock)
    elif plant == "dangling":
        os.symlink(tmp_path / "nowhere", lock)
    elif plant == "fifo":
        os.mkfifo(lock)
    elif plant == "hardlink":
        os.link(victim, lock)
    else:
        lock.write_text("12\n")
        os.chown(lock, 65534, 65534)
    with HostLock(host):
        st = lock.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1
        assert lock.read_text() == f"{os.getpid()}\n"
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in lock.parent.iterdir()) == [lock.name]  # no temp left


def test_another_users_lock_file_a_live_process_holds_is_refused(host, holder):
    """A foreign file held by a live process is not replaced (it may be an installer's)."""
    lock, _proc = holder
    os.chown(lock, 65534, 65534)
    with pytest.raises(LockHeldError, match="owned by uid 65534.*live process") as err, \
            HostLock(host):
        pass
    assert err.value.exit_code == 4
    assert lock.stat().st_uid == 65534


def test_a_lock_file_holding_more_than_a_pid_is_not_truncated(host):
    lock = host.root / "tmp/cos_gpu_installer_lock"
    lock.write_text("not a pid: something a person wrote\n")
    with HostLock(host):
        pass
    assert lock.read_text() == "not a pid: something a person wrote\n"


def test_protected_symlinks_eacces_is_a_clear_exit_4(host, monkeypatch):
    """With fs.protected_symlinks=1 the kernel answers EACCES for another user's link in a
    sticky dir (a global sysctl, so simulated here): a refusal, not a traceback."""
    import errno

    from installer.host import lock as lock_mod

    real_open = os.open

    def open_(path, flags, *args, **kw):
        if str(path) == "cos_gpu_installer_lock":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(lock_mod.os, "open", open_)
    with pytest.raises(LockHeldError, match="refusing the host lock .*Permission denied"), \
            HostLock(host):
        pass

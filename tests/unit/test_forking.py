"""installer/services/forking.py: a forking daemon watched by its sidecar (issue 38 §1)."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest
import structlog

from installer.base.errors import VerifyError
from installer.services import forking
from installer.services import supervise as daemons
from tests.fixtures import realpersistenced


@pytest.mark.parametrize("datagram, parsed", [
    # What NVIDIA's nvidia-persistenced sent to /dev/log (glibc syslog, no LOG_PID).
    (b"<29>Nov 28 22:37:44 nvidia-persistenced: Started (19193)",
     ("notice", "nvidia-persistenced", "Started (19193)")),
    (b"<27>Nov  8 22:37:44 nvidia-persistenced: device 0000:00:04.0 - failed to online "
     b"memory.\n", ("err", "nvidia-persistenced", "device 0000:00:04.0 - failed to online "
                    "memory.")),
    (b"<30>Nov 28 22:37:44 other[12]: hello", ("info", "other", "hello")),
    (b"not syslog at all", ("info", "", "not syslog at all")),
])
def test_parse_syslog(datagram, parsed):
    assert forking.parse_syslog(datagram) == parsed


def test_the_relay_turns_syslog_into_events_and_unbinds(tmp_path):
    tail: collections.deque[str] = collections.deque(maxlen=5)
    path = tmp_path / "log"
    with structlog.testing.capture_logs() as logs:
        relay = forking.SyslogRelay.open(path, "persistenced", tail)
        assert relay is not None
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.sendto(b"<29>Nov 28 22:37:44 nvidia-persistenced: Started (7)", str(path))
        sender.close()
        end = time.monotonic() + 5
        while not tail and time.monotonic() < end:
            time.sleep(0.05)
        relay.close()
    assert list(tail) == ["Started (7)"]
    said = [e for e in logs if e["event"] == "daemon_syslog"]
    assert said[0]["severity"] == "notice" and said[0]["daemon"] == "persistenced"
    assert not path.exists()


def test_a_taken_dev_log_is_left_alone(tmp_path):
    path = tmp_path / "log"
    path.symlink_to("/nonexistent/journal/dev-log")  # a node's /dev/log, dangling here
    assert forking.SyslogRelay.open(path, "persistenced", collections.deque()) is None
    assert path.is_symlink()


def test_a_dead_socket_left_by_a_killed_sidecar_is_taken_over(tmp_path):
    path = tmp_path / "log"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody receives
    relay = forking.SyslogRelay.open(path, "persistenced", collections.deque())
    assert relay is not None
    relay.close()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(path))  # a live one (a node's syslog) is left alone
    try:
        assert forking.SyslogRelay.open(path, "persistenced", collections.deque()) is None
    finally:
        live.close()


def test_exit_status_says_how_a_child_ended():
    child = subprocess.Popen(["sleep", "30"])
    assert forking.exit_status(child.pid) is None
    child.kill()
    end = time.monotonic() + 5
    while (status := forking.exit_status(child.pid)) is None and time.monotonic() < end:
        time.sleep(0.05)
    assert status == "signal SIGKILL"
    done = subprocess.Popen(["sh", "-c", "exit 3"])
    end = time.monotonic() + 30
    while (status := forking.exit_status(done.pid)) is None and time.monotonic() < end:
        time.sleep(0.05)
    assert status == "status 3"


def test_the_old_foreground_command_fails_with_one_line(tmp_path, monkeypatch):
    """NVIDIA's real daemon answers `--foreground` with "Invalid commandline" and exit 0 and
    starts no daemon: the watcher says so at once instead of recording a live daemon."""
    monkeypatch.setattr(forking, "PID_FILE_S", 0.5)
    watch = forking.Watch(tmp_path / "run/nvidia-persistenced.pid", tmp_path / "run/socket", 30)
    with pytest.raises(VerifyError) as caught:
        forking.run_forking(tmp_path, "persistenced",
                            [realpersistenced.binary(), "--foreground", "--verbose"], {},
                            watch, None)
    message = caught.value.message
    assert message.startswith("persistenced exited with status 0 but no daemon wrote "), message
    assert 'unrecognized option: "--foreground"' in message and "\n" not in message
    doc = json.loads(daemons.state_file(tmp_path, "persistenced").read_text())
    assert doc["state"] == daemons.EXITED and doc["detail"] == message


FORKS = """#!/bin/sh
# Forks: the child closes its standard files and, a moment later, writes the pid file; the
# parent exits 0 at once (sooner than NVIDIA's, which waits for the child: the worst case).
sh -c 'sleep 0.5; echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 30' "$PID_FILE" \
    </dev/null >/dev/null 2>&1 &
"""


def test_a_dead_daemons_pid_file_is_not_taken_for_the_new_one(tmp_path, monkeypatch):
    """A restarted sidecar container keeps /var/run: the pid file of the daemon that died
    must not pass for the new one; the watcher reaps the new one once it is killed."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    pid_file = tmp_path / "run.pid"
    pid_file.write_text(f"{dead.pid}\n")
    script = tmp_path / "forks"
    script.write_text(FORKS)
    script.chmod(0o755)
    monkeypatch.setattr(daemons, "HEARTBEAT_S", 0.1)
    watch = forking.Watch(pid_file, None, 10)
    env = {"PID_FILE": str(pid_file)}
    killer = threading.Thread(target=_kill_when_running, args=(tmp_path, dead.pid))
    killer.start()
    with pytest.raises(VerifyError) as caught:
        forking.run_forking(tmp_path, "persistenced", [script], env, watch, None)
    killer.join()
    new_pid = int(pid_file.read_text())
    assert new_pid != dead.pid
    assert caught.value.message.startswith(f"persistenced (pid {new_pid}) exited with ")


def _kill_when_running(install_root, stale_pid: int) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        state = daemons.read_state(install_root, "persistenced")
        if state is not None and state.state == daemons.RUNNING:
            os.kill(int(state.detail.split()[1]), signal.SIGKILL)
            return
        time.sleep(0.05)


@pytest.mark.parametrize("text", ["0", "1", "-1", " 12x", "", "9" * 40])
def test_a_pid_file_naming_no_single_process_is_no_pid(tmp_path, text):
    """0 and -1 would make kill and waitpid act on a whole group, 1 is init: the pid file is
    the daemon's to write, so anything but a pid above 1 reads as none."""
    pid_file = tmp_path / "daemon.pid"
    pid_file.write_text(text + "\n")
    assert forking.read_pid(pid_file) is None
    pid_file.write_text("4242\n")
    assert forking.read_pid(pid_file) == 4242


def test_stopping_a_process_that_ignores_sigterm_ends_in_sigkill_within_its_bound():
    child = subprocess.Popen(["sh", "-c", "trap '' TERM; echo trapped; exec sleep 30"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "trapped\n"  # its trap set (it ends in 30 s anyway)
    start = time.monotonic()
    forking.stop_pid(child.pid, 1.0)
    # Within its bound: 1 s of grace then SIGKILL, far from the 30 s it would sleep.
    assert not forking.pid_alive(child.pid) and time.monotonic() - start < 10

"""installer/forking.py: a forking daemon watched by its sidecar (issue 38 §1)."""

from __future__ import annotations

import collections
import json
import socket
import subprocess
import time

import pytest
import structlog

from installer import daemons, forking
from installer.errors import VerifyError
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


def test_exit_status_says_how_a_child_ended():
    child = subprocess.Popen(["sleep", "30"])
    assert forking.exit_status(child.pid) is None
    child.kill()
    end = time.monotonic() + 5
    while (status := forking.exit_status(child.pid)) is None and time.monotonic() < end:
        time.sleep(0.05)
    assert status == "signal SIGKILL"
    done = subprocess.Popen(["sh", "-c", "exit 3"])
    time.sleep(0.5)
    assert forking.exit_status(done.pid) == "status 3"


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

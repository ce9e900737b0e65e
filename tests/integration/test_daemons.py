"""Issue 31 §3, issue 38 §1: nvidia-persistenced as a sidecar, with NVIDIA's real daemon
(Debian's build, tests/fixtures/realpersistenced.py, in the fixture .run behind a launcher
that shows it the fake kernel), and readiness that waits for the daemons the DaemonSet runs
(NVIDIA_REQUIRED_DAEMONS, set by `manifests render --persistenced`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures import realpersistenced
from tests.pod import events, last_event, ok

STATE = "daemons/persistenced.json"


@pytest.fixture
def persistenced(pod, node, sidecars):
    """The install put the .run's nvidia-persistenced (NVIDIA's, behind payload/
    real-binary.sh) and libnvidia-cfg.so.1 in the install dir."""
    ok(pod.run("install"))
    assert (node.install_dir / "bin/nvidia-persistenced").is_file()
    assert (node.install_dir / "lib64/libnvidia-cfg.so.1").exists()
    return lambda **env: sidecars("persistenced", **env)


def ready(node) -> dict[str, str]:
    text = (node.root / "run/nvidia/validations/driver-ready").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def state(node) -> dict:
    path = node.install_dir / STATE
    return json.loads(path.read_text()) if path.exists() else {}


def wait_state(node, proc, wanted: str, deadline_s: float = 60) -> dict:
    end = time.monotonic() + deadline_s
    while (doc := state(node)).get("state") != wanted:
        assert time.monotonic() < end, f"no {wanted!r} state: {doc}, sidecar rc={proc.poll()}"
        time.sleep(0.2)
    return doc


def next_heartbeat(node, proc, deadline_s: float = 60) -> None:
    """Wait until the sidecar rewrites its state file (its heartbeat, every 5 s: write_atomic
    makes a new file each time), rather than sleeping past one."""
    path = node.install_dir / STATE
    first = path.stat()
    end = time.monotonic() + deadline_s
    while (now := path.stat()).st_ino == first.st_ino and now.st_mtime_ns == first.st_mtime_ns:
        assert time.monotonic() < end, f"no heartbeat in {deadline_s}s, sidecar rc={proc.poll()}"
        time.sleep(0.2)


def test_the_real_daemon_refuses_foreground_and_exits_0(tmp_path):
    """What the old sidecar ran (`--foreground --verbose`): NVIDIA's parse_options answers
    "unrecognized option" / "Invalid commandline" and exits 0 before daemonize, so the old
    sidecar recorded `exited` and every install requiring it failed verify."""
    proc = subprocess.run([realpersistenced.binary(), "--foreground", "--verbose"],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 0
    assert 'unrecognized option: "--foreground"' in proc.stderr
    assert "ERROR: Invalid commandline" in proc.stderr
    help_text = subprocess.run([realpersistenced.binary(), "--help"], capture_output=True,
                               text=True, timeout=30).stdout
    for option in ("--persistence-mode", "--verbose", "--nvidia-cfg-path"):
        assert option in help_text, option
    assert "--foreground" not in help_text


def test_the_sidecar_keeps_the_real_daemon_up_and_ready_waits_for_it(pod, node, persistenced):
    proc = persistenced()
    doc = wait_state(node, proc, "running")
    pid = int(doc["detail"].split()[1].rstrip(","))
    assert "no socket" not in doc["detail"]
    ok(pod.run("install", env={"NVIDIA_REQUIRED_DAEMONS": "persistenced"}))
    fields = ready(node)
    assert fields["DAEMONS"] == "persistenced"
    assert fields["CUDA_CHECK"] == "passed" and fields["NVLINK_FABRIC"] == "none"
    next_heartbeat(node, proc)  # one heartbeat later it is the same daemon, still watched
    assert proc.poll() is None
    assert state(node)["state"] == "running" and state(node)["detail"] == f"pid {pid}"
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    said = [e for e in events(err) if e.get("event") == "daemon_syslog"]
    messages = [e["message"] for e in said]
    # The daemon's own syslog lines, relayed from /dev/log as structured events.
    assert any(m.startswith("Started (") for m in messages), messages
    assert any("device 0000:00:04.0 - registered" in m for m in messages), messages
    assert all(e["tag"] == "nvidia-persistenced" for e in said)
    assert any(m.startswith("Shutdown (") for m in messages), messages  # it was stopped
    assert state(node)["state"] == "exited"


def test_a_daemon_that_cannot_start_is_not_ready_and_says_why(pod, node, kernel, persistenced):
    # No GPU bound to the driver: NVIDIA's daemon cannot list /sys/bus/pci/drivers/nvidia
    # and fails to initialize (exit 1, nvidia-numa.c setup_numa_auto_online).
    shutil.rmtree(kernel.sys_dir / "bus/pci/drivers/nvidia")
    proc = persistenced()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 9, err[-3000:]
    reason = last_event(SimpleNamespace(stderr=err))["error"]
    assert reason.startswith("persistenced exited with status 1: "), reason
    assert "failed to initialize" in reason and "/sys/bus/pci/drivers/nvidia" in reason
    assert "\n" not in reason
    assert state(node)["state"] == "exited"
    install = pod.run("install", env={"NVIDIA_REQUIRED_DAEMONS": "persistenced"})
    assert install.returncode == 9, install.stderr[-3000:]
    error = last_event(install)["error"]
    assert error.startswith("the persistenced sidecar is not running: persistenced exited "
                            "with status 1"), error
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()


def test_a_daemon_that_dies_makes_the_sidecar_exit_with_the_reason(pod, node, persistenced):
    proc = persistenced()
    doc = wait_state(node, proc, "running")
    pid = int(doc["detail"].split()[1].rstrip(","))
    # The daemon lives in the pod's pid namespace: find it there by the pid it wrote.
    killed = _kill_in_pod(proc.pid, pid)
    assert killed, f"no process {pid} in the pod"
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 9, err[-3000:]
    reason = last_event(SimpleNamespace(stderr=err))["error"]
    assert reason.startswith(f"persistenced (pid {pid}) exited with signal SIGKILL: "), reason
    assert "Started (" in reason and "\n" not in reason
    assert state(node)["state"] == "exited"
    install = pod.run("install", env={"NVIDIA_REQUIRED_DAEMONS": "persistenced"})
    assert install.returncode == 9, install.stderr[-3000:]
    assert f"persistenced (pid {pid}) exited" in last_event(install)["error"]


def _kill_in_pod(outer_pid: int, inner_pid: int) -> bool:
    """SIGKILL the process that is ``inner_pid`` in the pid namespace of ``outer_pid``'s
    children (the pod: `unshare --pid --fork`), found through /proc's NSpid lines."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])
        if len(nspid) >= 2 and int(nspid[-1]) == inner_pid and _descends(int(entry), outer_pid):
            os.kill(int(entry), signal.SIGKILL)
            return True
    return False


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False

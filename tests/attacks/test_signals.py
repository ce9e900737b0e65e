"""Case 12: SIGTERM (the kubelet deleting the pod) and SIGINT (Ctrl-C) mid-install.

The installer must stop its children, release the host lock, keep the last good install,
log a final event and exit 143 / 130 -- not vanish silently, not exit 1.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.attacks.conftest import RUN, V_OLD, V, final, tree
from tests.pod import events

pytestmark = pytest.mark.chroot

# A driver package whose extraction never ends; it notes when it starts and how it stops.
# It runs inside the build jail, which writes nothing of ours but its own tree and the
# test seams (docs/jail.md), so it notes it in the fake kernel's proc dir.
HANGING_RUN = """#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 (makeself's variables: it passes the header check)"
skip="1"
trap 'echo stopped-by-TERM >> {log}; exit 143' TERM
export NDI_SIGNAL_TEST_MARK={mark}
echo started >> {log}
while :; do sleep 0.1; done
"""


def _processes_marked(mark: str) -> list[int]:
    """Processes (of any PID namespace) whose environment carries ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"NDI_SIGNAL_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return found


def _installer_pid(pod_proc) -> int:
    """The installer: the only child of ``unshare`` (PID 1 of the pod's namespace)."""
    children = Path(f"/proc/{pod_proc.pid}/task/{pod_proc.pid}/children")
    for _ in range(100):
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError("the pod never started the installer")


def _wait_for(path: Path, text: str, timeout: float = 60) -> None:
    stop = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < stop, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_install_stops_children_releases_the_lock_and_keeps_the_install(
        ubuntu, sig, code):
    install = ubuntu.node.install_dir
    first = ubuntu.run("install", env={"NVIDIA_DRIVER_VERSION": V_OLD})
    assert first.returncode == 0, first.stderr[-3000:]
    good = tree(install)
    child_log = ubuntu.kernel.proc_dir / f"ndi-signal-test-{os.getpid()}-{sig}"
    child_log.unlink(missing_ok=True)
    mark = f"{os.getpid()}-{sig}-{time.monotonic_ns()}"
    ubuntu.server.serve(f"/tesla/{V}/{RUN}", HANGING_RUN.format(log=child_log, mark=mark))
    ubuntu.snapshot()

    proc = ubuntu.pod.start("install", env={"NVIDIA_DRIVER_VERSION": V})
    try:
        _wait_for(child_log, "started")
        os.kill(_installer_pid(proc), sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()

    assert proc.returncode == code, stderr[-3000:]
    last = final(type("P", (), {"stderr": stderr})())
    assert last["event"] == "install_interrupted"
    assert last["message"].startswith(f"INTERRUPTED by {signal.Signals(sig).name} (exit {code})")
    # The package was asked to stop (its TERM trap ran: bwrap passed the group's TERM on
    # and did not kill the jail first, jail/run_in_jail.py) and nothing of it outlives the install.
    assert "stopped-by-TERM" in child_log.read_text()
    deadline = time.monotonic() + 5
    while _processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_marked(mark) == [], "a jailed process outlived the installer"
    child_log.unlink()
    # The last good install, byte for byte; nothing half-made left; the outcome recorded.
    after = tree(install)
    assert {k: v for k, v in after.items() if k != "status.json"} == \
        {k: v for k, v in good.items() if k != "status.json"}
    status = json.loads((install / "status.json").read_text())
    assert status["outcome"] == "interrupted" and status["exit_code"] == code
    # The host lock is free again.
    fd = os.open(ubuntu.node.path("/tmp/cos_gpu_installer_lock"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert [e["event"] for e in events(stderr) if "event" in e].count("install_interrupted") == 1
    ubuntu.assert_host_unchanged(installed=True)  # the readiness file waits for the next run

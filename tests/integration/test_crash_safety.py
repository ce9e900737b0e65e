"""A node killed mid-install, a full disk, two installers at once: the last good install survives.

Each kill is a real SIGKILL of the whole pod (its PID namespace) at a named point
of a driver upgrade; afterwards the node must hold either the previous install,
intact and recorded, or no record at all, and the next run must complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from installer.records import cache
from tests.fixtures import failpoint
from tests.fixtures.node import tree_digest
from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

LAYOUT = ("bin", "lib64", "drivers", "firmware", ".cache")


def layout_digest(install_dir):
    return {k: v for k, v in tree_digest(install_dir).items() if k.split("/")[0] in LAYOUT}


def run_until(pod, marker: dict, *, env, hold: str = "", deadline_s: float = 60) -> list[dict]:
    """Start an install and SIGKILL the whole pod when an event matching ``marker`` is logged.
    ``hold``: a step (tests/fixtures/failpoint.py's ``<step>[#<n>]``) that waits for the kill,
    where the marker's point is a step boundary the installer would otherwise run past while
    the kill is on its way (on a busy machine, even the next step's write)."""
    if hold:
        env = {**env, failpoint.VARIABLE: f"{hold}:{failpoint.HOLD}"}
    proc = pod.start("install", "--verbose", env=env,
                     module="tests.fixtures.failpoint" if hold else "installer")
    seen = []
    stop = time.monotonic() + deadline_s
    try:
        for line in proc.stderr:
            seen.extend(events(line))
            event = seen[-1]
            if all(event.get(k) == v for k, v in marker.items()):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if time.monotonic() > stop:
                pytest.fail(f"marker {marker} not seen in {deadline_s}s")
        else:
            pytest.fail(f"install ended before {marker}: {[e.get('event') for e in seen]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return seen


def assert_nothing_false_recorded(install_dir):
    """A .cache left behind must describe files that are really there and unchanged."""
    record = cache.read(install_dir / ".cache")
    if record is not None:
        assert cache.check_files(record, install_dir) is None
        assert record.file_hashes, "our records always carry hashes"


@pytest.mark.parametrize(
    ("marker", "before_swap", "hold"),
    [
        pytest.param({"event": "download_started"}, True, "", id="downloading"),
        pytest.param({"event": "step_started", "step": "extract_driver"}, True, "",
                     id="extracting"),
        pytest.param({"event": "nvidia_installer_started"}, True, "",
                     id="nvidia-installer-running"),
        # The kill lands after the swap and before anything later (the step after promote,
        # installer/steps/activate.py: the plan's second gpu_firmware)...
        pytest.param({"event": "install_promoted"}, False, "gpu_firmware#2", id="just-swapped"),
        # ...and at record_cache's start: without the hold, a loaded machine let the write
        # happen before the SIGKILL arrived (the .cache was there: a flake, not a finding).
        pytest.param({"event": "step_started", "step": "record_cache"}, False, "record_cache",
                     id="before-cache-record"),
    ],
)
def test_sigkill_during_upgrade(node, pod, kernel, server, marker, before_swap, hold):
    ok(pod.run("install"))
    good = layout_digest(node.install_dir)
    if marker["event"] == "download_started":
        # A slow download so the kill lands while it streams. Only there: a later marker's
        # kill lands at its own event, so the other cases need not wait out a slow download.
        server.fault(f"/tesla/{V2}/NVIDIA-Linux-x86_64-{V2}.run", rate=40_000)
    run_until(pod, marker, env={"NVIDIA_DRIVER_VERSION": V2}, hold=hold)

    assert_nothing_false_recorded(node.install_dir)
    if before_swap:
        # The previous install was never touched: same bytes, same record, still valid.
        assert layout_digest(node.install_dir) == good
        assert f"CACHE_NVIDIA_DRIVER_VERSION={V1}" in (node.install_dir / ".cache").read_text()
    else:
        assert not (node.install_dir / ".cache").exists()

    server.fault(f"/tesla/{V2}/NVIDIA-Linux-x86_64-{V2}.run")  # clear the slow-down
    proc = ok(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}))
    assert last_event(proc)["driver_version"] == V2
    assert kernel.loaded()["nvidia"].version == V2
    assert not (node.install_dir / ".staging").exists()
    assert not (node.install_dir / ".previous").exists()


@pytest.mark.parametrize("spare", [pytest.param(16 * 1024, id="no-room-to-download"),
                                   pytest.param(160 * 1024, id="no-room-to-extract")])
def test_full_disk_is_exit_11_and_keeps_the_last_install(node, pod, server, tmp_path, spare):
    ok(pod.run("install"))
    good = layout_digest(node.install_dir)
    used = int(subprocess.run(["du", "-sk", "--apparent-size", str(node.install_dir)],
                              capture_output=True, text=True, check=True).stdout.split()[0])
    # tmpfs counts whole pages per file: leave room for the seeded copy plus `spare` bytes.
    files = sum(1 for _ in node.install_dir.rglob("*"))
    size = used * 1024 + files * 4096 + spare
    out = tmp_path / "after"
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2},
                   install_dir_tmpfs=str(size), export_install_dir=out)
    assert proc.returncode == 11, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["error_class"] == "disk_space" and "MiB" in final["error"] or "space" in final["error"]
    assert "Traceback" not in proc.stderr
    assert layout_digest(out) == good
    assert not (out / ".staging").exists()


def test_second_installer_exits_4_or_waits(node, pod, server):
    server.fault(f"/tesla/{V1}/NVIDIA-Linux-x86_64-{V1}.run", rate=30_000)
    first = pod.start("install")
    try:
        # Wait until the first one holds the lock (it logs the plan under the lock).
        for line in first.stderr:
            if '"plan_ready"' in line:
                break
        second = pod.run("install")
        assert second.returncode == 4, second.stderr[-1500:]
        final = last_event(second)
        assert "another installer holds the host lock" in final["error"]
        # Each test pod has its own PID namespace (a pod with hostPID sees the holder's PID in
        # /proc/locks): never the PID the first one wrote in the lock file (issue 26).
        assert final["error"].endswith("(its PID is not visible from here)")
        waiting = pod.run("install", "--lock-timeout", "120")
        assert waiting.returncode == 0, waiting.stderr[-1500:]
        assert last_event(waiting)["plan"] == "cached"  # the first one finished the job
    finally:
        first.wait(timeout=120)
    assert first.returncode == 0
    status = json.loads((node.install_dir / "status.json").read_text())
    assert status["outcome"] == "ok"

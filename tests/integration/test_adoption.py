"""Issue 26's rough edges, run as the pod runs it: what an operator trying the installer
by hand hits first (a closed pipe, stale lock files, never-installed nodes, firmware left
behind by uninstall)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.fixtures.node import INSTALL_HOST
from tests.integration.conftest import V1, V2
from tests.pod import events, last_event, ok

pytestmark = pytest.mark.chroot

READY = "run/nvidia/validations/driver-ready"


def _run_with_closed_output(pod, *args: str, keep_lines: int, env=None) -> int:
    """``install … 2>&1 | head -N``: read N lines of stderr, then close both pipes (stdout
    at once) as ``head`` does when it exits; the run goes on writing into closed pipes."""
    proc = pod.start(*args, env=env)
    proc.stdout.close()
    for _ in range(keep_lines):
        proc.stderr.readline()
    proc.stderr.close()
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    return proc.wait(timeout=10)


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_a_closed_pipe_never_changes_what_happens_to_the_node(node, pod, log_format):
    ok(pod.run("install"))
    assert (node.root / READY).exists()
    code = _run_with_closed_output(pod, "install", "--force", "-o", "json", keep_lines=3,
                                   env={"LOG_FORMAT": log_format})
    assert code == 0
    status = json.loads((node.install_dir / "status.json").read_text())
    assert (status["outcome"], status["plan"], status["driver_version"]) == ("ok", "fresh", V1)
    assert (node.root / READY).exists()
    # and the next run, output intact, is a cache hit of that install
    assert last_event(ok(pod.run("install")))["plan"] == "cached"


def test_an_option_meaningless_on_this_os_is_refused_before_anything_changes(node, pod):
    ok(pod.run("install"))
    before = (node.install_dir / "status.json").read_bytes()
    proc = pod.run("install", "--force", env={"COS_ARTIFACTS_SHA256": "/pins.sha256"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--cos-artifacts-sha256" in last_event(proc)["message"]
    assert (node.root / READY).exists()  # refused before the lock: the node as it was
    assert (node.install_dir / "status.json").read_bytes() == before


def test_doctor_on_a_never_installed_node_says_how_to_install(pod):
    proc = pod.run("doctor", "--json")
    assert proc.returncode == 9, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    text = json.dumps(doc)
    assert "--force" not in text and "re-run" not in text
    found = {f["check"]: f for f in doc["findings"]}
    assert "never run" in found["installer_status"]["detail"]
    assert "never run" in found["install_dir"]["detail"]


def test_a_build_failure_names_the_kept_log_by_its_host_path(node, pod):
    (node.root / f"usr/src/linux-headers-{node.kernel_release}/.fake-build-fails").write_text("")
    proc = pod.run("install")
    assert proc.returncode == 7, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["hint"] == (f"see {INSTALL_HOST}/nvidia-installer.failed.log on the node for "
                             "the full log")
    assert (node.install_dir / "nvidia-installer.failed.log").is_file()
    assert "/usr/local/nvidia" not in final["message"]


def test_uninstall_removes_the_firmware_copies_it_made_and_only_those(node, kernel, pod):
    # A kernel without firmware_class.path: install copies the GSP firmware into the
    # host's /lib/firmware/updates (installer.kmod.firmware._copy_to_host).
    kernel.drop_firmware_path()
    updates = node.root / "lib/firmware/updates/nvidia"

    def files() -> list[str]:
        return sorted(p.relative_to(updates).as_posix() for p in updates.rglob("*") if p.is_file())

    ok(pod.run("install"))
    ours = files()
    assert ours and all(name.startswith(f"{V1}/") for name in ours)
    someone_elses = updates / "other/gsp_x.bin"
    someone_elses.parent.mkdir()
    someone_elses.write_bytes(b"not ours")
    proc = ok(pod.run("uninstall", "-o", "json"))
    removed = json.loads(proc.stdout)["changes"]["firmware_copies_removed"]
    assert removed == [f"/lib/firmware/updates/nvidia/{n}" for n in ours]
    assert files() == ["other/gsp_x.bin"] and not (updates / V1).exists()

    ok(pod.run("install"))
    (updates / ours[0]).write_bytes(b"replaced by someone")  # same name, other bytes
    proc = ok(pod.run("uninstall", "-o", "json"))
    assert json.loads(proc.stdout)["changes"]["firmware_copies_removed"] == ours[1:]
    assert files() == [ours[0], "other/gsp_x.bin"]


def test_a_run_of_another_version_is_refused_before_the_driver_is_touched(
        node, pod, kernel, server, driver_runs):
    ok(pod.run("install"))
    before = {p: p.read_bytes() for p in node.install_dir.rglob("*") if p.is_file()
              and p.name != "status.json"}
    rmmods = len(kernel.calls("rmmod"))
    # The server's 535.183.01 .run is really 550.54.14 (a mirror's mix-up, a renamed file).
    server.serve(f"/tesla/{V2}/NVIDIA-Linux-x86_64-{V2}.run", driver_runs[V1])
    proc = pod.run("install", "--force", env={"NVIDIA_DRIVER_VERSION": V2})
    assert proc.returncode == 6, proc.stderr[-3000:]
    final = last_event(proc)
    assert f"is driver {V1}, not {V2}" in final["message"]
    assert len(kernel.calls("rmmod")) == rmmods  # nothing unloaded
    assert kernel.loaded()["nvidia"].version == V1
    after = {p: p.read_bytes() for p in node.install_dir.rglob("*") if p.is_file()
             and p.name != "status.json"}
    assert after == before


@pytest.fixture
def read_only_install_dir(node):
    """The node's install dir mounted read-only (a pod whose volume is ro, a ro filesystem):
    the pod's bind mount of it is read-only too."""
    path = str(node.install_dir)
    subprocess.run(["mount", "--bind", path, path], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", path], check=True)
        yield node.install_dir
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def test_a_read_only_install_dir_is_named_before_anything_changes(node, pod, kernel, request):
    ok(pod.run("install"))
    ready_before = (node.root / READY).read_text()
    request.getfixturevalue("read_only_install_dir")
    for command in ("install", "uninstall"):
        proc = pod.run(command)
        final = last_event(proc)
        assert proc.returncode == 3, (command, proc.stderr[-2000:])
        assert final["error"].startswith(f"the install dir /usr/local/nvidia (host {INSTALL_HOST}) "
                                         "is not writable"), final["error"]
        assert "read-only" in final["error"].lower()
        assert "/root" not in final["hint"]
        assert not any(e.get("event") == "readiness_written" for e in events(proc.stderr))
    assert (node.root / READY).read_text() == ready_before  # nothing touched: still ready
    assert "nvidia" in kernel.loaded()  # uninstall unloaded nothing

"""A run that fails after it unloaded the working driver leaves the node as it was.

DESIGN §4: the old driver loaded again from the install dir, with its firmware
path and device files; the install dir and its .cache byte-identical; the
readiness file absent, as after any failed run (README, "Readiness after a
failed upgrade"). One test per step that can fail once the old driver
is out (load_modules, device_nodes, verify_staged, and verify after promote),
plus a fresh node, where "as it was" means no driver at all.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from tests.fixtures.node import tree_digest
from tests.fixtures.runfile import driver_payload, pack_run, run_name
from tests.integration.conftest import V1, V2, serve_runs
from tests.pod import events, last_event, ok, pod_on

pytestmark = pytest.mark.chroot
serving = contextlib.contextmanager(serve_runs)

FIRMWARE_PATH = "module/firmware_class/parameters/path"  # under the fake /sys
READY = "run/nvidia/validations/driver-ready"
SMI_FAILS = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. \
Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""
# The real nvidia-smi rides along as nvidia-debugdump (a file the installer installs):
# the staged one works, the promoted one fails.
SMI_FAILS_AFTER_PROMOTE = """#!/bin/sh
case "$0" in */.staging/*) exec "$(dirname "$0")/nvidia-debugdump" "$@" ;; esac
""" + SMI_FAILS.split("\n", 1)[1]
MODPROBE_FAILS = "#!/bin/sh\nexit 1\n"


def custom_run(out: Path, version: str, **files: str) -> Path:
    """NVIDIA-Linux-x86_64-<version>.run whose named payload files are replaced."""
    payload = out / f"payload-{version}"
    shutil.copytree(driver_payload(version), payload, symlinks=True)
    if "nvidia_smi" in files:
        shutil.copy(payload / "nvidia-smi", payload / "nvidia-debugdump")
    for name, text in files.items():
        target = payload / name.replace("_", "-")
        target.write_text(text)
        target.chmod(0o755)
    return pack_run(payload, out / run_name(version), version, "--sha256")


@pytest.fixture
def kernel(kernel):
    # A real kernel has firmware_class.path (empty unless set): the staged firmware's
    # path is set on it during the upgrade, and must be put back.
    (kernel.sys_dir / FIRMWARE_PATH).parent.mkdir(parents=True)
    (kernel.sys_dir / FIRMWARE_PATH).write_text("\n")
    return kernel


def node_state(node, kernel) -> dict:
    install = node.install_dir
    ready = node.root / READY
    char = kernel.dev_dir / "char"
    return {
        "install": {k: v for k, v in tree_digest(install).items() if k != "status.json"},
        "modules": {m.name: m.version for m in kernel.loaded().values() if "nvidia" in m.name},
        "firmware_path": (kernel.sys_dir / FIRMWARE_PATH).read_text().strip(),
        "devices": kernel.devices(),
        "char_links": sorted(p.name for p in char.iterdir()) if char.is_dir() else [],
        "ready": ready.read_text() if ready.exists() else None,
    }


def upgrade_fails(node, kernel, tmp_path, run: Path | None, step: str, exit_code: int):
    """Install V1, then an upgrade to V2 (``run``, else the stock V2) failing at ``step``."""
    runs = {V1: driver_run_path(tmp_path, V1), V2: run or driver_run_path(tmp_path, V2)}
    with serving(runs) as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})
        ok(pod.run("install"))
        before = node_state(node, kernel)
        proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2})
    assert proc.returncode == exit_code, proc.stderr[-3000:]
    assert last_event(proc)["step"] == step, last_event(proc)
    return before, proc


def driver_run_path(tmp_path: Path, version: str) -> Path:
    from tests.fixtures.runfile import build_driver_run

    return build_driver_run(tmp_path / "runs", version)


def assert_restored(before: dict, node, kernel, proc) -> None:
    after = node_state(node, kernel)
    assert before["modules"] and set(before["modules"].values()) == {V1}
    assert before.pop("ready") and after.pop("ready") is None
    assert after == before
    names = [e.get("event") for e in events(proc.stderr)]
    assert "previous_driver_reloaded" in names and "roll_back_incomplete" not in names, names


def test_load_failure_after_the_unload(node, kernel, tmp_path):
    kernel.refuse("nvidia-uvm", V2)  # "Unknown symbol in module", after nvidia (V2) loaded
    before, proc = upgrade_fails(node, kernel, tmp_path, None, "load_modules", 8)
    assert "Unknown symbol" in last_event(proc)["error"]
    assert_restored(before, node, kernel, proc)


def test_device_node_failure_after_the_unload(node, kernel, tmp_path):
    run = custom_run(tmp_path / "custom", V2, nvidia_modprobe=MODPROBE_FAILS)
    before, proc = upgrade_fails(node, kernel, tmp_path, run, "device_nodes", 9)
    assert_restored(before, node, kernel, proc)


def test_staged_verify_failure_after_the_unload(node, kernel, tmp_path):
    run = custom_run(tmp_path / "custom", V2, nvidia_smi=SMI_FAILS)
    before, proc = upgrade_fails(node, kernel, tmp_path, run, "verify_staged", 9)
    assert "couldn't communicate" in last_event(proc)["error"]
    assert_restored(before, node, kernel, proc)


def test_verify_failure_after_promote_restores_the_previous_install(node, kernel, tmp_path):
    run = custom_run(tmp_path / "custom", V2, nvidia_smi=SMI_FAILS_AFTER_PROMOTE)
    before, proc = upgrade_fails(node, kernel, tmp_path, run, "verify", 9)
    names = [e.get("event") for e in events(proc.stderr)]
    assert "install_promoted" in names and "previous_install_restored" in names
    assert not (node.install_dir / ".previous").exists()
    assert_restored(before, node, kernel, proc)


def test_a_failed_fresh_install_leaves_no_driver_behind(node, kernel, tmp_path):
    run = custom_run(tmp_path / "custom", V1, nvidia_smi=SMI_FAILS)
    with serving({V1: run}) as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})
        before = node_state(node, kernel)
        proc = pod.run("install")
        assert proc.returncode == 9, proc.stderr[-3000:]
        assert last_event(proc)["step"] == "verify_staged"
        after = node_state(node, kernel)
        assert before["modules"] == {} and before["devices"] == {}
        assert {k: after[k] for k in ("modules", "firmware_path", "devices", "char_links",
                                      "ready")} == {k: before[k] for k in
                                                    ("modules", "firmware_path", "devices",
                                                     "char_links", "ready")}
        # Made and then taken back: the run did reach the kernel.
        assert [c["argv"][0] for c in kernel.calls("insmod")]
        assert not (node.install_dir / ".cache").exists()

"""A run that fails after it unloaded the working driver leaves the node as it was.

docs/contract.md §4 and the issue-20 contract: the old driver loaded again from the install
dir, with its module parameters, firmware path and device files; the install dir
and its .cache byte-identical; the readiness file back, byte for byte. One test
per step that can fail once the old driver is out: load_modules, device_nodes,
verify_staged, the second verify, and (test_failure_at_each_later_step) the
firmware steps, the Vulkan ICD file, promote, both ld caches, record_cache; the
cache-hit path that reloads the driver for new module parameters; a fresh node,
where "as it was" means no driver at all; and a failure after record_cache, which
keeps the new driver.

Each failure is real (a failing tool, a path blocked on the node, a mount point
in the way) except where only a failpoint reaches the step
(tests/fixtures/failpoint.py: the second gpu_firmware, record_cache).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures.kernel import FIRMWARE_PATH_PARAM
from tests.fixtures.node import tree_digest
from tests.fixtures.plans import ACTIVATE_STAGED
from tests.fixtures.runfile import driver_payload, pack_run, run_name
from tests.integration.conftest import V1, V2, serve_runs
from tests.pod import events, last_event, ok, pod_on

pytestmark = pytest.mark.chroot
serving = contextlib.contextmanager(serve_runs)

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
# ldconfig that fails once, for the scope its arm file names ("host": -r <root>, else
# "container"), as the real one does on a full disk; then it is the real one again.
LDCONFIG_ONCE = """#!/bin/sh
case " $* " in *" -r "*) scope=host ;; *) scope=container ;; esac
if [ "$(cat {arm} 2>/dev/null)" = "$scope" ]; then
    rm -f {arm}
    echo "ldconfig: Can't create temporary cache file /etc/ld.so.cache~: No space left on device" >&2
    exit 1
fi
exec /sbin/ldconfig "$@"
"""


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


def node_state(node, kernel) -> dict:
    install = node.install_dir
    ready = node.root / READY
    char = kernel.dev_dir / "char"
    return {
        "install": {k: v for k, v in tree_digest(install).items() if k != "status.json"},
        "modules": {m.name: m.version for m in kernel.loaded().values() if "nvidia" in m.name},
        "nvidia_params": kernel.loaded()["nvidia"].params if "nvidia" in kernel.loaded() else {},
        "firmware_path": (kernel.sys_dir / FIRMWARE_PATH_PARAM).read_text().strip(),
        "devices": kernel.devices(),
        "char_links": sorted(p.name for p in char.iterdir()) if char.is_dir() else [],
        "ready": ready.read_text() if ready.exists() else None,
    }


@dataclass
class Failure:
    """How the upgrade to V2 is made to fail: ``before`` runs before V1 is installed,
    ``after`` once it is (node, kernel); ``env`` and ``pod_kw`` go to the V2 run."""

    before: Callable[..., None] | None = None
    after: Callable[..., None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    pod_kw: dict[str, object] = field(default_factory=dict)


def upgrade_fails(node, kernel, tmp_path, run: Path | None, step: str, exit_code: int,
                  failure: Failure | None = None):
    """Install V1, then an upgrade to V2 (``run``, else the stock V2) failing at ``step``."""
    failure = failure or Failure()
    runs = {V1: driver_run_path(tmp_path, V1), V2: run or driver_run_path(tmp_path, V2)}
    with serving(runs) as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})
        if failure.before:
            failure.before(node, kernel)
        ok(pod.run("install"))
        if failure.after:
            failure.after(node, kernel)
        before = node_state(node, kernel)
        proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2, **failure.env},
                       **failure.pod_kw)
    assert proc.returncode == exit_code, proc.stderr[-3000:]
    assert failed_step(node) == step, proc.stderr[-3000:]
    return before, proc


def failed_step(node) -> str:
    """The step the last run ended in (status.json: also for an unexpected error)."""
    return json.loads((node.install_dir / "status.json").read_text())["steps"][-1]["name"]


def driver_run_path(tmp_path: Path, version: str) -> Path:
    from tests.fixtures.runfile import build_driver_run

    return build_driver_run(tmp_path / "runs", version)


def assert_restored(before: dict, node, kernel, proc) -> None:
    after = node_state(node, kernel)
    assert before["modules"] and set(before["modules"].values()) == {V1}
    assert before["ready"] and f"NVIDIA_DRIVER_VERSION={V1}\n" in before["ready"]
    assert after == before  # the readiness file too, byte for byte
    names = [e.get("event") for e in events(proc.stderr)]
    assert "previous_driver_reloaded" in names and "roll_back_incomplete" not in names, names
    assert "readiness_restored" in names


def ldconfig_fails_once(scope: str):
    """A Failure.after: ldconfig on the pod's PATH fails once for ``scope``."""
    def arm(node, kernel):
        flag = kernel.root / "ldconfig-fails"
        (kernel.bin_dir / "ldconfig").write_text(LDCONFIG_ONCE.format(arm=flag))
        (kernel.bin_dir / "ldconfig").chmod(0o755)
        flag.write_text(scope)
    return arm


def foreign_firmware_path(node, kernel):
    """firmware_class.path set by someone else: the firmware is copied to the host's
    /lib/firmware/updates (firmware.py)."""
    (kernel.sys_dir / FIRMWARE_PATH_PARAM).write_text("/opt/vendor/firmware\n")


def v2_firmware_dir_blocked(node, kernel):
    (node.root / "lib/firmware/updates/nvidia").mkdir(parents=True, exist_ok=True)
    (node.root / "lib/firmware/updates/nvidia" / V2).write_text("not a directory\n")


def host_dir_blocked(node, kernel):
    (node.root / "etc/vulkan-blocked").write_text("not a directory\n")


def failpoint(spec: str) -> Failure:
    return Failure(env={"NDI_FAILPOINT": spec}, pod_kw={"module": "tests.fixtures.failpoint"})


LATER_FAILURES = [  # (step, exit code, how), in plan order
    # A stale file where V2's firmware copy goes, with the firmware path someone else's.
    ("gpu_firmware", 8, Failure(before=foreign_firmware_path, after=v2_firmware_dir_blocked)),
    ("vulkan_icd", 9, Failure(after=host_dir_blocked,
                              env={"VULKAN_ICD_DIR_HOST": "/etc/vulkan-blocked/icd.d"})),
    # Something mounted on the install's firmware/: its rename fails half way (EBUSY).
    ("promote", 3, Failure(pod_kw={"busy": ("/usr/local/nvidia/firmware",)})),  # EBUSY
    ("gpu_firmware", 8, failpoint("gpu_firmware#2:ModuleLoadError")),  # the live install's
    ("container_ld_cache", 9, Failure(after=ldconfig_fails_once("container"))),
    ("host_ld_cache", 9, Failure(after=ldconfig_fails_once("host"))),
    ("record_cache", 11, failpoint("record_cache:ENOSPC")),
]
# The steps the tests below this list fail, one test each.
SINGLE_FAILURES = ["load_modules", "device_nodes", "verify_staged", "verify"]


def test_every_step_after_the_unload_has_a_failure_test():
    """Up to record_cache: after it the new driver is committed and nothing rolls back
    (dev_char_links only warns)."""
    after = ACTIVATE_STAGED[ACTIVATE_STAGED.index("unload_other_driver") + 1:
                            ACTIVATE_STAGED.index("record_cache") + 1]
    tested = Counter([step for step, _, _ in LATER_FAILURES] + SINGLE_FAILURES)
    assert Counter(after) - tested == Counter()


@pytest.mark.parametrize("step, exit_code, failure", LATER_FAILURES,
                         ids=["gpu_firmware-staged", "vulkan_icd", "promote", "gpu_firmware-live",
                              "container_ld_cache", "host_ld_cache", "record_cache"])
def test_failure_at_each_later_step(node, kernel, tmp_path, step, exit_code, failure):
    before, proc = upgrade_fails(node, kernel, tmp_path, None, step, exit_code, failure)
    assert_restored(before, node, kernel, proc)


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


def test_failure_on_a_cache_hit_that_reloads_the_driver_for_new_module_args(node, kernel,
                                                                            tmp_path):
    """load_cached unloads the unused driver to load it with new NVIDIA_MODULE_ARGS
    (apply_module_args); a failure after that loads it again with the ones it had."""
    with serving({V1: driver_run_path(tmp_path, V1)}) as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})
        ok(pod.run("install", env={"NVIDIA_MODULE_ARGS": "nvidia.NVreg_EnableGpuFirmware=0"}))
        ldconfig_fails_once("container")(node, kernel)
        before = node_state(node, kernel)
        proc = pod.run("install")  # no module args now
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert failed_step(node) == "container_ld_cache"
    names = [e.get("event") for e in events(proc.stderr)]
    assert "modules_reloading" in names and "install_promoted" not in names
    assert before["nvidia_params"]["NVreg_EnableGpuFirmware"] == "0"
    assert_restored(before, node, kernel, proc)


def test_a_failure_after_record_cache_keeps_the_new_driver(node, kernel, tmp_path):
    """Once .cache records the verified V2, a failure (in production: the readiness file
    cannot be written; here a failpoint after record_cache) rolls nothing back."""
    failure = failpoint("persistence_mode:VerifyError")
    failure.env["NVIDIA_PERSISTENCE_MODE"] = "true"
    before, proc = upgrade_fails(node, kernel, tmp_path, None, "persistence_mode", 9, failure)
    after = node_state(node, kernel)
    assert set(after["modules"].values()) == {V2}
    assert f"CACHE_NVIDIA_DRIVER_VERSION={V2}" in (node.install_dir / ".cache").read_text()
    assert after["devices"] == before["devices"] and after["ready"] is None
    names = [e.get("event") for e in events(proc.stderr)]
    assert "previous_driver_reloaded" not in names and "readiness_restored" not in names


def test_readiness_stays_cleared_when_the_run_finds_the_loaded_driver_broken(node, kernel,
                                                                             tmp_path):
    """A cache hit that changes nothing in the kernel and whose nvidia-smi fails: the
    file named a driver this very run found not working, so it does not come back."""
    with serving({V1: driver_run_path(tmp_path, V1)}) as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})
        ok(pod.run("install"))
        assert (node.root / READY).exists()
        (kernel.proc_dir / "driver/nvidia/version").unlink()  # RmInitAdapter failed, say
        proc = pod.run("install")
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert failed_step(node) == "verify"
    assert set(node_state(node, kernel)["modules"].values()) == {V1}
    assert not (node.root / READY).exists()
    (why,) = [e["reason"] for e in events(proc.stderr) if e.get("event") == "readiness_not_restored"]
    assert why == f"this run found driver {V1} itself not working"


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

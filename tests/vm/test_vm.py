"""The qemu tier: module loading and the ld cache in a real kernel (see conftest.py).

One guest, two boots; each test asserts on the steps the boots ran
(``scenario.py``). A failing assertion prints the step's output, the kernel
messages it caused and /proc/modules.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.vm.harness import BootResult, StepResult
from tests.vm.scenario import INSTALL_DIR, PARAM, VERSIONS

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]

A, B, C, D, E = (VERSIONS[k] for k in "abcde")
NV_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
# The message each fake module's init prints (proof the kernel ran it).
INIT_MESSAGE = {
    "nvidia": "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {v}",
    "nvidia_uvm": "nvidia-uvm: Loaded the UVM driver",
    "nvidia_modeset": "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  {v}",
    "nvidia_drm": "nvidia-drm: [drm] fake driver {v}",
}
LAYOUT = ("bin/", "lib64/", "drivers/", "firmware/")


def ok(step: StepResult) -> StepResult:
    assert step.rc == 0, step.describe()
    return step


def events(step: StepResult, name: str | None = None) -> list[dict]:
    evs = step.json_events()
    return [e for e in evs if name is None or e.get("event") == name]


def plan_kind(step: StepResult) -> str:
    plans = events(step, "plan_ready")
    assert plans, f"no plan_ready event\n{step.describe()}"
    return plans[-1]["kind"]


def steps_run(step: StepResult) -> list[str]:
    return [e["step"] for e in events(step, "step_finished")]


def failure(step: StepResult) -> dict:
    failed = events(step, "install_failed")
    assert failed, f"no install_failed event\n{step.describe()}"
    return failed[-1]


def init_lines(step: StepResult, module: str, version: str) -> list[int]:
    want = INIT_MESSAGE[module].format(v=version)
    return [i for i, line in enumerate(step.dmesg) if want in line]


def assert_loaded_in_order(step: StepResult, version: str) -> None:
    """Each module's init ran once, nvidia first, modeset before drm."""
    at = {}
    for module in NV_MODULES:
        hits = init_lines(step, module, version)
        assert len(hits) == 1, f"{module} init ran {len(hits)} times\n{step.describe()}"
        at[module] = hits[0]
    assert at["nvidia"] < at["nvidia_uvm"], step.describe()
    assert at["nvidia"] < at["nvidia_modeset"] < at["nvidia_drm"], step.describe()


def no_module_loads(step: StepResult) -> None:
    for module in NV_MODULES:
        for version in (A, B, C, D, E):
            assert not init_lines(step, module, version), step.describe()


def layout(probe: dict) -> dict[str, str]:
    """The installed files that make the driver (bin, lib64, drivers, .cache)."""
    return {k: v for k, v in probe["install"].items() if k.startswith(LAYOUT) or k == ".cache"}


def probe(boot: BootResult, name: str) -> dict:
    return ok(boot.step(name)).json_doc()


def assert_driver_working(state: dict, version: str) -> None:
    """Loaded at ``version`` with the parameter, nodes made, ld cache and nvidia-smi good."""
    sysmod = state["sysmodule"]
    for module in NV_MODULES:
        assert sysmod[module] is not None, f"{module} not loaded: {state['modules']}"
        assert sysmod[module]["version"] == version, sysmod[module]
    # Where NVIDIA's nvidia.ko shows its parameters (nv-procfs.c), and not in sysfs.
    assert f'Test: "{PARAM}"' in (state["nvidia_params"] or "").splitlines(), state["nvidia_params"]
    assert "NVreg_Test" not in sysmod["nvidia"]["parameters"], sysmod["nvidia"]
    # nvidia is used by its own uvm and modeset only; modeset by drm.
    assert sorted(state["modules"]["nvidia"]["used_by"]) == ["nvidia_modeset", "nvidia_uvm"]
    assert state["modules"]["nvidia_modeset"]["used_by"] == ["nvidia_drm"]
    assert "nvidia_drm" in state["modules"]["drm"]["used_by"]
    assert {"nvidiactl", "nvidia0", "nvidia-uvm"} <= set(state["devices"]), state["devices"]
    assert state["devices"]["nvidiactl"][:2] == [195, 255]
    # libnvidia-ml.so.1 resolves through /etc/ld.so.cache into the install dir.
    ml = [ln for ln in state["ldconfig"] if ln.startswith("libnvidia-ml.so.1 ")]
    assert ml and all(ln.endswith(f"=> {INSTALL_DIR}/lib64/libnvidia-ml.so.1") for ln in ml), state[
        "ldconfig"
    ]
    assert state["install"]["lib64/libnvidia-ml.so.1"] == f"-> libnvidia-ml.so.{version}"
    smi = state["smi"]
    assert smi["rc"] == 0 and f"Driver Version: {version}" in smi["out"], smi
    assert f"CACHE_NVIDIA_DRIVER_VERSION={version}" in state["cache"]
    assert f"CACHE_KERNEL_VERSION={state['kernel']}" in state["cache"]


# ------------------------------------------------------------------ boot 1


def test_guest_runs_the_provisioned_kernel(boot_install, vm_assets):
    detected = json.loads(ok(boot_install.step("detect")).stdout)
    assert detected["kernel_release"] == vm_assets.kernel_release
    assert detected["flow"] == "debian"  # the guest is Debian 12
    assert detected["loaded_driver_version"] is None


def test_first_install_compiles_in_the_guest_and_loads_in_dependency_order(boot_install):
    step = ok(boot_install.step("install-a"))
    assert plan_kind(step) == "fresh"
    assert "build_driver" in steps_run(step)
    # kbuild compiled the modules in the guest, run by our make of NVIDIA's Makefile;
    # nvidia-installer only installed user space (--no-kernel-module: it built, loaded
    # and unloaded nothing).
    build_log = ok(boot_install.step("kernel-build-log-a")).stdout
    assert "CC [M]" in build_log and "nvidia.ko" in build_log, build_log[-3000:]
    log = ok(boot_install.step("installer-log-a")).stdout
    assert "--no-kernel-module" in log and "Building kernel modules" not in log, log[-3000:]
    assert_loaded_in_order(step, A)
    # The kernel's own messages for the first out-of-tree module.
    assert any("loading out-of-tree module taints kernel" in ln for ln in step.dmesg)


def test_first_install_works(boot_install):
    state = probe(boot_install, "probe-a")
    assert_driver_working(state, A)
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
        assert f"drivers/{name}.ko" in state["install"]
    assert "bin/nvidia-smi" in state["install"] and "bin/nvidia-modprobe" in state["install"]
    assert state["status"] and state["status"].get("exit_code", 0) == 0, state["status"]
    # The host's ld.so.conf names the install dir once.
    entries = [
        path for path, text in state["ld_so_conf"].items() if text and f"{INSTALL_DIR}/lib64" in text.split()
    ]
    assert len(entries) == 1, state["ld_so_conf"]


def test_second_run_is_a_cache_hit_that_loads_nothing(boot_install):
    step = ok(boot_install.step("install-a-again"))
    assert plan_kind(step) == "cached"
    assert "build_driver" not in steps_run(step)
    no_module_loads(step)
    before, after = probe(boot_install, "probe-a"), probe(boot_install, "probe-a-again")
    assert_driver_working(after, A)
    # Same module instances (same address, refcount), same files.
    for module in NV_MODULES:
        assert after["modules"][module]["line"] == before["modules"][module]["line"]
    assert layout(after) == layout(before)


def test_new_version_replaces_the_unused_old_one(boot_install):
    step = ok(boot_install.step("install-b"))
    assert plan_kind(step) == "fresh"
    unloads = [i for i, ln in enumerate(step.dmesg) if f"unloading NVIDIA Kernel Module {A}" in ln]
    assert len(unloads) == 1, step.describe()
    assert_loaded_in_order(step, B)
    assert unloads[0] < init_lines(step, "nvidia", B)[0]
    state = probe(boot_install, "probe-b")
    assert_driver_working(state, B)
    assert not any(A in k for k in state["install"]), sorted(state["install"])


def _assert_refused_in_use(boot_install, step_name: str, probe_name: str, holder: str):
    step = boot_install.step(step_name)
    assert step.rc == 8, step.describe()
    fail = failure(step)
    assert fail["exit_code"] == 8 and fail["error_class"] == "module_load"
    text = fail["message"]
    assert B in text and C in text and holder in text, fail
    no_module_loads(step)
    before, after = probe(boot_install, "probe-b"), probe(boot_install, probe_name)
    assert layout(after) == layout(before), "the install dir changed"
    assert after["cache"] == before["cache"]
    for module in NV_MODULES:
        assert after["sysmodule"][module]["version"] == B


def test_replacement_refused_while_a_module_holds_nvidia(boot_install):
    held = ok(boot_install.step("hold-module"))
    assert re.search(r"^nvidia \d+ 3 \S*nvidia_holder", held.stdout, re.M), held.stdout
    _assert_refused_in_use(boot_install, "install-c-held", "probe-held", "nvidia_holder")
    state = probe(boot_install, "probe-held")
    assert "nvidia_holder" in state["sysmodule"]["nvidia"]["holders"]


def test_replacement_refused_while_a_process_has_the_device_open(boot_install):
    held = ok(boot_install.step("hold-handle"))
    # An open /dev/nvidia0 counts in nvidia's refcount but names no holder module.
    m = re.search(r"^nvidia \d+ (\d+) (\S+) ", held.stdout, re.M)
    assert m, held.stdout
    assert int(m.group(1)) > len([u for u in m.group(2).split(",") if u and u != "-"])
    _assert_refused_in_use(boot_install, "install-c-handle", "probe-handle", "has /dev/nvidia0 open")
    released = ok(boot_install.step("release-handle"))
    assert re.search(r"^nvidia \d+ 2 nvidia_modeset,nvidia_uvm,", released.stdout, re.M)


# ------------------------------------------------------------------ boot 2


def test_reboot_keeps_the_install_and_loads_nothing_by_itself(boot_install, boot_reboot):
    state = probe(boot_reboot, "probe-reboot")
    assert all(state["sysmodule"][m] is None for m in NV_MODULES), state["modules"]
    # The stand-in nvidia-smi needs the loaded module, not just the files.
    assert state["smi"]["rc"] == 9, state["smi"]
    assert "couldn't communicate with the NVIDIA driver" in state["smi"]["out"]
    assert layout(state) == layout(probe(boot_install, "probe-b"))


def test_wrong_load_order_fails_in_the_kernel(boot_reboot):
    uvm = boot_reboot.step("wrong-order-uvm")
    assert uvm.rc != 0 and "Unknown symbol in module" in uvm.stderr, uvm.describe()
    assert any("nvidia_uvm: Unknown symbol nvidia_register_client" in ln for ln in uvm.dmesg)
    drm = boot_reboot.step("wrong-order-drm")
    assert drm.rc != 0 and "Unknown symbol in module" in drm.stderr, drm.describe()
    assert any("nvidia_drm: Unknown symbol nvKmsKapiGetFunctionsTable" in ln for ln in drm.dmesg)


def test_cache_hit_after_reboot_loads_without_rebuilding(boot_install, boot_reboot):
    step = ok(boot_reboot.step("install-b-cached"))
    assert plan_kind(step) == "cached"
    ran = steps_run(step)
    assert "build_driver" not in ran and "download_driver" not in ran
    assert_loaded_in_order(step, B)
    state = probe(boot_reboot, "probe-b-cached")
    assert_driver_working(state, B)
    assert layout(state) == layout(probe(boot_install, "probe-b"))


def test_module_built_for_another_kernel_fails_with_exit_8(boot_reboot, vm_assets):
    step = boot_reboot.step("install-d-other-kernel")
    assert step.rc == 8, step.describe()
    fail = failure(step)
    assert fail["error_class"] == "module_load"
    assert vm_assets.kernel_release in fail["message"], fail
    from tests.vm.driver_run import other_release

    assert other_release(vm_assets.kernel_release) in fail["message"], fail
    # The previous install and its record are untouched, and its driver was never unloaded:
    # every built module is checked against the running kernel before the old one goes.
    before, after = probe(boot_reboot, "probe-b-cached"), probe(boot_reboot, "probe-d")
    assert layout(after) == layout(before)
    assert_driver_working(after, B)
    # The kernel itself refuses such a module.
    direct = boot_reboot.step("kernel-rejects-other-kernel")
    assert direct.rc != 0 and "Invalid module format" in direct.stderr, direct.describe()
    assert any("disagrees about version of symbol module_layout" in ln for ln in direct.dmesg)


def test_unresolved_symbol_at_load_fails_with_exit_8(boot_reboot):
    """nvidia-uvm from "another driver version": the kernel refuses it, the installer says so."""
    step = boot_reboot.step("install-e-unknown-symbol")
    assert step.rc == 8, step.describe()
    fail = failure(step)
    assert fail["error_class"] == "module_load"
    assert "nvidia_uvm" in fail["message"] and "Unknown symbol" in fail["message"], fail
    assert any("nvidia_uvm: Unknown symbol nvidia_uvm_api_from_another_version" in ln for ln in step.dmesg), (
        step.describe()
    )
    # The kernel's lines are in the installer's own failure report.
    assert any("Unknown symbol" in ln for ln in fail.get("kernel_log_tail", [])), fail
    state = probe(boot_reboot, "probe-e")
    assert layout(state) == layout(probe(boot_reboot, "probe-b-cached"))
    # The half-loaded new driver was rolled back and the previous one loaded again.
    assert "previous_driver_reloaded" in step.stderr, step.describe()
    assert_driver_working(state, B)


def test_cached_driver_loads_again_after_the_failed_runs(boot_reboot):
    step = ok(boot_reboot.step("install-b-recover"))
    assert plan_kind(step) == "cached"
    assert_driver_working(probe(boot_reboot, "probe-recover"), B)


# ------------------------------------- boot 2, last steps: signatures enforced


def assert_enforcing(boot: BootResult) -> None:
    """The kernel took the switch to enforcement and refused to undo it (-EROFS = errno 30:
    kernel/params.c param_set_bool_enable_only), as with module.sig_enforce=1 at boot."""
    assert ok(boot.step("enforce")).stdout.strip() == "Y"
    undo = boot.step("enforce-undo-refused")
    assert undo.rc != 0 and "[Errno 30] Read-only file system" in undo.output, undo.describe()
    assert undo.stdout.strip() == "Y", undo.describe()


def test_signature_enforcement_refuses_with_exit_10(boot_sig_enforce):
    unloaded = ok(boot_sig_enforce.step("unload-b"))
    assert not re.search(r"^nvidia", unloaded.stdout, re.M), unloaded.stdout
    assert_enforcing(boot_sig_enforce)
    cached = boot_sig_enforce.step("install-b-enforced")
    assert cached.rc == 10, cached.describe()
    assert failure(cached)["error_class"] == "secure_boot"
    # The kernel's own refusal of an unsigned module.
    assert any("Loading of unsigned module is rejected" in ln for ln in cached.dmesg), cached.describe()
    fresh = boot_sig_enforce.step("install-a-enforced")
    assert fresh.rc == 10, fresh.describe()  # not 5: refused before the download
    assert "download_driver" not in steps_run(fresh)
    assert failure(fresh)["error_class"] == "secure_boot"
    state = probe(boot_sig_enforce, "probe-enforced")
    assert all(state["sysmodule"][m] is None for m in NV_MODULES), state["modules"]

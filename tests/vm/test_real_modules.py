"""NVIDIA's real kernel modules in the real kernel, loaded by the installer.

The modules were built on the host by the installer itself, through its sandbox, from
NVIDIA's real 535 (proprietary and open) and 470 sources (tests/realparts); the guest
runs a cache-hit install of each. With no NVIDIA GPU under qemu, the kernel accepts
each nvidia.ko (vermagic, symbol versions, format, in-tree dependencies) and runs its
init, which reports ``NVRM: No NVIDIA GPU found.`` and fails with ENODEV (nv.c,
``nvidia_init_module``): everything short of the hardware.
"""

from __future__ import annotations

import pytest

from tests.vm.harness import BootResult, StepResult
from tests.vm.scenario import INSTALL_DIR, REAL_FLAVORS

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]

NO_GPU = ("the driver built and the kernel accepted nvidia.ko, but no NVIDIA GPU is attached "
          "to this node (kernel: NVRM: No NVIDIA GPU found.)")
NV_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")


def ok(step: StepResult) -> StepResult:
    assert step.rc == 0, step.describe()
    return step


def final_event(step: StepResult) -> dict:
    finals = [e for e in step.json_events() if e.get("event") == "install_failed"]
    assert finals, step.describe()
    return finals[-1]


def assert_init_found_no_gpu(step: StepResult, *, plan: str | None = None) -> None:
    """The kernel accepted nvidia.ko and ran its init, which found no GPU: exit 8 with that
    sentence; no module refused for its symbols or version. ``plan``: the plan kind it ran."""
    assert step.rc == 8, step.describe()
    final = final_event(step)
    assert final["error_class"] == "module_load" and final["exit_code"] == 8
    assert final["error"] == NO_GPU, step.describe()
    if plan is not None:
        plans = [e for e in step.json_events() if e.get("event") == "plan_ready"]
        assert plans and plans[-1]["kind"] == plan, step.describe()
    assert any("NVRM: No NVIDIA GPU found." in ln for ln in step.dmesg), step.describe()
    assert not any("Unknown symbol" in ln or "disagrees about version" in ln
                   for ln in step.dmesg), step.describe()


def assert_bundle_installed_without_compiling(step: StepResult) -> None:
    """A --prebuilt-only install: the bundle staged, no nvidia-installer run, then the
    kernel's init found no GPU."""
    names = [e.get("event") for e in step.json_events()]
    assert "prebuilt_bundle_staged" in names, step.describe()
    assert "nvidia_installer_started" not in names, step.describe()  # nothing compiled
    assert_init_found_no_gpu(step)


@pytest.mark.parametrize("install", sorted(REAL_FLAVORS))
def test_kernel_accepts_real_modules_and_init_finds_no_gpu(boot_real: BootResult, install):
    ok(boot_real.step("mount-data"))
    ok(boot_real.step(f"place-{install}"))
    # The kernel ran nvidia.ko's init: it had accepted the module; nothing rebuilt.
    assert_init_found_no_gpu(boot_real.step(f"run-{install}"), plan="cached")
    # nvidia.ko's in-tree dependency was loaded first from the guest's own module tree
    # (each module's own: the loads stopped at nvidia, before modeset needs video).
    after = ok(boot_real.step(f"modules-after-{install}"))
    loaded, modules = set(after.loaded()), after.stdout
    assert "drm" in loaded, modules
    # Nothing half-loaded.
    assert not loaded & set(NV_MODULES), modules


def test_gsp_firmware_found_by_the_real_loader_only_after_install(boot_real: BootResult):
    """A module asking request_firmware_direct() for nvidia/<V>/gsp_ga10x.bin, as nvidia.ko
    does when a GPU initialises: not found before the installer ran, found after."""
    before = boot_real.step("firmware-before")
    assert before.rc != 0, before.describe()
    assert any("ndi_fwreq" in ln and "not found (-2)" in ln for ln in before.dmesg), before.describe()
    path = ok(boot_real.step("firmware-path")).stdout.strip()
    assert path == f"{INSTALL_DIR}/firmware"
    after = ok(boot_real.step("firmware-after"))
    assert any("ndi_fwreq" in ln and "found," in ln for ln in after.dmesg), after.describe()


def test_signature_enforcement_refuses_the_real_modules(boot_real_enforced: BootResult):
    from tests.vm.test_vm import assert_enforcing

    assert_enforcing(boot_real_enforced)
    ok(boot_real_enforced.step("place-install-535-enforced"))
    step = boot_real_enforced.step("run-install-535-enforced")
    assert step.rc == 10, step.describe()
    assert final_event(step)["error_class"] == "secure_boot"
    assert any("Loading of unsigned module is rejected" in ln for ln in step.dmesg), step.describe()
    after = ok(boot_real_enforced.step("modules-after-enforced"))
    assert "nvidia" not in after.loaded(), after.stdout

"""R550 and the open kernel modules for real: NVIDIA's 550.163.01 in Debian's 6.12 (issue 21).

Debian 13 ships NVIDIA's real 550.163.01 trees (``nvidia-kernel-source`` and, in contrib,
``nvidia-open-kernel-source``), its GSP firmware, nvidia-smi and NVML
(tests/realparts/provision.py, branch ``r550``). The installer builds both module types on
this machine through its sandbox, as the pod runs it, against Debian's 6.12 headers split
into source and output dirs (tests/realparts/newer_kernel.py: bookworm-backports' 6.12,
the same series built with Debian 12's gcc-12); a 6.12 guest loads each build.

With no NVIDIA GPU under qemu, nvidia.ko's init runs and fails: ``NVRM: No NVIDIA GPU
found.``, ENODEV. nv.c ``nvidia_init_module``: after ``nv_module_init``,
``nvos_count_devices() == 0`` (and no NVSwitch) prints it and returns -ENODEV before
``nv_drivers_init`` (550.163.01 as Debian ships it: kernel-open/nvidia/nv.c line 867,
kernel/nvidia/nv.c line 832).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from installer.services.verify import SMI_FAILURES, VerifyError
from tests.vm.harness import BootResult
from tests.vm.scenario import GSP_FILES, INSTALL_DIR, R550_FLAVORS
from tests.vm.test_real_modules import (
    NO_GPU,
    NV_MODULES,
    assert_bundle_installed_without_compiling,
    assert_init_found_no_gpu,
    final_event,
    ok,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]

BUILD_DIR = {"open": "kernel-open", "proprietary": "kernel"}
CORE = {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko"}
# 550's Kbuild also builds nvidia-peermem (a stub without MOFED: no depends, its own
# "Dual BSD/GPL" license); the installer keeps it and never loads it unasked.
OPTIONAL = {"nvidia-peermem.ko"}


def modinfo_fields(text: str) -> dict[str, dict[str, list[str]]]:
    """``modinfo a.ko b.ko`` -> {module file name: {field: [values]}}."""
    found: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "filename":
            current = found.setdefault(value.strip().rsplit("/", 1)[-1], {})
        current.setdefault(key, []).append(value.strip())
    return found


def declared_licenses(tree) -> dict[str, str]:
    """module file -> the MODULE_LICENSE its sources in ``tree`` declare. The trees differ
    (550.163.01: nvidia/nv.c "NVIDIA" in kernel/, "Dual MIT/GPL" in kernel-open/), so a
    module's license tells which tree it was built from."""
    found = {}
    for src in sorted(tree.glob("nvidia*/*.c")):
        m = re.search(r'MODULE_LICENSE\("([^"]+)"\)', src.read_text(errors="replace"))
        if m:
            found[f"{src.parent.name}.ko"] = m.group(1)
    return found


# ----------------------------------------------------------- the host builds


@pytest.mark.parametrize("install", sorted(R550_FLAVORS))
def test_r550_built_through_the_installer_against_split_612_headers(r550_installs, newer_kernel,
                                                                     install):
    installs, version, parts = r550_installs
    _assets, headers = newer_kernel
    done = installs[install]
    module_type = R550_FLAVORS[install]
    tree = parts.r550.kernel_open if module_type == "open" else parts.r550.kernel
    licenses = declared_licenses(tree)
    assert set(licenses) >= CORE, licenses
    assert done.rc == 0, done.events[-3:]
    build = done.event("kernel_modules_build_started")["argv"]
    # NVIDIA's own Makefile in the tree of the asked type, split Debian source/output dirs
    # (550 has no --kernel-module-type: which tree is built is the installer's choice).
    assert build[:3] == ["make", "-C", f"/tmp/nvidia-driver-installer/extract/{BUILD_DIR[module_type]}"]
    assert any(a.startswith("SYSSRC=") and a.endswith(headers.source.name) for a in build), build
    assert any(a.startswith("SYSOUT=") and a.endswith(headers.output.name) for a in build), build
    assert "--no-kernel-module" in done.event("nvidia_installer_started")["argv"]
    assert "--no-kernel-module" in done.installer_log
    drivers = done.install_dir / "drivers"
    kos = {p.name for p in drivers.glob("*.ko")}
    assert CORE <= kos <= CORE | OPTIONAL, kos
    info = modinfo_fields(subprocess.run(["modinfo", *map(str, sorted(drivers.glob("*.ko")))],
                                         capture_output=True, text=True, check=True).stdout)
    for name, fields in info.items():
        assert fields["version"] == [version], (name, fields)
        assert fields["vermagic"][0].startswith(headers.abi + " "), (name, fields)
        assert fields["license"] == [licenses[name]], (name, fields)
    firmware = info["nvidia.ko"].get("firmware", [])
    assert sorted(firmware) == sorted(f"nvidia/{version}/{f}" for f in GSP_FILES), firmware
    installed = done.install_dir / "firmware"  # the kernel's name under firmware_class.path
    assert sorted(str(p.relative_to(installed)) for p in installed.rglob("*.bin")) == \
        sorted(firmware)


# ------------------------------------------------------------- in the guest


def test_guest_runs_the_612_kernel(boot_r550: BootResult, newer_kernel):
    assets, _headers = newer_kernel
    assert ok(boot_r550.step("uname")).stdout.strip() == assets.kernel_release
    assert assets.kernel_release.startswith("6.12.")


@pytest.mark.parametrize("install", sorted(R550_FLAVORS))
def test_612_kernel_accepts_r550_and_init_finds_no_gpu(boot_r550: BootResult, install):
    ok(boot_r550.step("mount-data"))
    ok(boot_r550.step(f"place-{install}"))
    info = modinfo_fields(ok(boot_r550.step(f"modinfo-{install}")).stdout)
    assert CORE <= set(info) <= CORE | OPTIONAL, info
    # nvidia.ko's license names its tree: "NVIDIA" only in the proprietary one.
    assert (info["nvidia.ko"]["license"] == ["NVIDIA"]) == (R550_FLAVORS[install] == "proprietary")
    assert_init_found_no_gpu(boot_r550.step(f"run-{install}"), plan="cached")  # nothing rebuilt
    # nvidia.ko's in-tree dependencies came from the guest's own 6.12 tree before it;
    # nothing of NVIDIA's stayed half-loaded.
    after = set(ok(boot_r550.step(f"modules-after-{install}")).loaded())
    deps = {d for d in info["nvidia.ko"].get("depends", [""])[0].split(",") if d}
    assert deps <= after, (deps, after)
    assert not after & set(NV_MODULES), after


def test_in_tree_dependencies_come_from_the_guests_own_612_tree(boot_r550: BootResult, newer_kernel):
    """What the built modules declare (nvidia: drm; nvidia-modeset: video; nvidia-drm: drm,
    drm_kms_helper, drm_ttm_helper) resolves in the guest's own 6.12 module tree. The
    installer loads each module's own dependencies before it, so with no GPU only nvidia's
    (drm) are loaded: the kernel refuses nvidia before modeset or drm are tried."""
    assets, _headers = newer_kernel
    declared: set[str] = set()
    for install in R550_FLAVORS:
        info = modinfo_fields(ok(boot_r550.step(f"modinfo-{install}")).stdout)
        for fields in info.values():
            declared |= {d for d in fields.get("depends", [""])[0].split(",") if d}
        assert {"drm", "drm_kms_helper", "nvidia-modeset"} <= \
            set(info["nvidia-drm.ko"]["depends"][0].split(",")), info
        assert "video" in info["nvidia-modeset.ko"]["depends"][0].split(","), info
    ours = {n.removesuffix(".ko") for n in CORE | OPTIONAL} | set(NV_MODULES)
    in_tree = sorted(declared - ours)
    assert {"drm", "drm_kms_helper", "video"} <= set(in_tree), in_tree
    shown = ok(boot_r550.step("in-tree-deps")).stdout
    for name in in_tree:
        assert re.search(rf"^insmod /lib/modules/{re.escape(assets.kernel_release)}/\S+/"
                         rf"{name}\.ko", shown, re.M), (name, shown)


def test_gsp_550_firmware_found_only_after_the_installer_set_it(boot_r550: BootResult,
                                                                boot_r550_reboot: BootResult):
    """request_firmware_direct("nvidia/550.163.01/gsp_*.bin"), as nvidia.ko asks when a GPU
    initialises: not found before our firmware step, found after it; a reboot forgets
    firmware_class.path, and the cache-hit run after it sets it again."""
    for name in GSP_FILES:
        stem = name.split(".")[0]
        for boot, when, found in ((boot_r550, "before", False), (boot_r550, "after", True),
                                  (boot_r550_reboot, "rebooted", False),
                                  (boot_r550_reboot, "from-cache", True)):
            step = boot.step(f"firmware-{when}-{stem}")
            if found:
                assert step.rc == 0 and any("ndi_fwreq" in ln and "found," in ln
                                            for ln in step.dmesg), step.describe()
            else:
                assert step.rc != 0 and any("ndi_fwreq" in ln and "not found (-2)" in ln
                                            for ln in step.dmesg), step.describe()
    assert ok(boot_r550.step("firmware-path")).stdout.strip() == f"{INSTALL_DIR}/firmware"
    rerun = boot_r550_reboot.step(f"rerun-{list(R550_FLAVORS)[-1]}")
    assert rerun.rc == 8 and final_event(rerun)["error"] == NO_GPU, rerun.describe()


def test_real_nvidia_smi_550_after_the_failed_init_is_classified(boot_r550: BootResult):
    """NVIDIA's own nvidia-smi and NVML 550 with no nvidia module loaded: their real words
    and exit code, and the installer's verify hint for them (a failed nvidia-smi is exit 9,
    docs/contract.md §2)."""
    step = boot_r550.step("real-smi")
    assert step.rc == 9, step.describe()  # NVIDIA-SMI's own code for this failure
    assert "couldn't communicate with the NVIDIA driver" in step.output, step.describe()
    # As root, NVML made the control node itself, with no driver loaded: what issue 20's
    # fake nvidia-smi models (c 195, 255); nothing else.
    assert "nvidia" not in boot_r550.step("dev-before-real-smi").stdout
    made = [ln.split() for ln in boot_r550.step("dev-after-real-smi").stdout.splitlines()]
    assert [(f[0][0], f[4], f[5], f[-1]) for f in made] == [("c", "195,", "255", "nvidiactl")], made
    classified = ok(boot_r550.step("real-smi-classified")).stdout
    assert "rc=9" in classified
    hint = re.search(r"^hint: (.*)$", classified, re.M)
    expected = next(h for text, h in SMI_FAILURES if "couldn't communicate" in text)
    assert hint and hint.group(1) == expected, classified
    # The installer's own verify ran the real binary (stale device files get it past the
    # device check) and ended in exit 9 with the real words and that hint.
    verify = boot_r550.step("verify-real-smi")
    assert verify.rc == VerifyError.exit_code == 9, verify.describe()
    final = [e for e in verify.json_events() if e.get("event") == "verify_failed"]
    assert final, verify.describe()
    assert "couldn't communicate with the NVIDIA driver" in final[-1]["error"], verify.describe()
    assert final[-1]["hint"] == expected, verify.describe()


def test_open_550_bundle_installs_on_a_fresh_612_node(boot_r550_reboot: BootResult):
    """``bundle build``'s writer packed the open 550 install; ``--prebuilt-only`` takes it on
    a fresh install dir (no compiler, no .run), keyed by module type."""
    ok(boot_r550_reboot.step("fresh-node"))
    wrong = boot_r550_reboot.step("bundle-550-proprietary")
    assert wrong.rc == 5, wrong.describe()  # only the open bundle is published
    assert "no prebuilt bundle" in final_event(wrong)["error"], wrong.describe()
    assert_bundle_installed_without_compiling(boot_r550_reboot.step("bundle-550-open"))
    after = boot_r550_reboot.step("after-bundle-550-open")
    assert not set(after.loaded()) & set(NV_MODULES), after.describe()

"""The installer builds NVIDIA's real 535 (proprietary and open) and 470 kernel modules
with NVIDIA's own Makefile through its sandbox, exactly as in the pod, and loses no
compiler probe doing so; NVIDIA's installer then runs for user space only.

Cold, each build takes 2-3 minutes on 2 cores; results are cached by their inputs
(the installer's files that shape the build included: shaping.py), so a rerun takes seconds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from installer.base.errors import VerifyError
from installer.host.installdir import Tree
from installer.kmod.kernel import KernelState
from installer.services.verify import nvidia_smi
from tests.fixtures import nvidia_options
from tests.fixtures.runfile import driver_payload
from tests.realparts import kbuild, runfile
from tests.realparts.provision import RealParts
from tests.realparts.through_installer import RealInstall, install_real

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(1800)]

OBJECTS = kbuild.COMPARED_OBJECTS
MODULE_FILES = ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko", "nvidia-uvm.ko",
                "nvidia.ko"]
DEPENDS = {"nvidia": "drm", "nvidia-uvm": "nvidia", "nvidia-modeset": "nvidia,video",
           "nvidia-drm": "drm,drm_kms_helper,nvidia-modeset"}


def modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True,
                          check=True).stdout.strip()


def _run(parts: RealParts, version: str) -> Path:
    """The real kernel trees and firmware, with the fixture's user space (fake kernel)."""
    return runfile.build_real_run(version, "full", parts, userspace=driver_payload(version))


@pytest.fixture(scope="session")
def real_535(real_parts: RealParts, headers: kbuild.Headers) -> RealInstall:
    v = real_parts.main.version
    return install_real(_run(real_parts, v), v, "proprietary", headers)


@pytest.fixture(scope="session")
def real_535_open(real_parts: RealParts, headers: kbuild.Headers) -> RealInstall:
    v = real_parts.main.version
    return install_real(_run(real_parts, v), v, "open", headers, expect_ok=False)


@pytest.fixture(scope="session")
def real_470(real_parts: RealParts, headers: kbuild.Headers) -> RealInstall:
    v = real_parts.legacy.version
    return install_real(_run(real_parts, v), v, "proprietary", headers)


def _check_build(done: RealInstall, version: str, abi: str, firmware: bool) -> list[str]:
    drivers = done.install_dir / "drivers"
    for name, depends in DEPENDS.items():
        ko = drivers / f"{name}.ko"
        # R470's nvidia-uvm carries no MODULE_VERSION.
        assert modinfo(ko, "version") in ((version, "") if name == "nvidia-uvm" else (version,))
        assert modinfo(ko, "vermagic").split()[0] == abi, name
        assert modinfo(ko, "depends") == depends, name
    fw = sorted(p.name for p in (done.install_dir / f"firmware/nvidia/{version}").glob("*.bin"))
    assert fw == (["gsp_ga10x.bin", "gsp_tu10x.bin"] if firmware else [])
    cache = (done.install_dir / ".cache").read_text()
    assert f"CACHE_NVIDIA_DRIVER_VERSION={version}" in cache
    assert f"CACHE_KERNEL_VERSION={abi}" in cache
    argv = done.event("nvidia_installer_started")["argv"]
    # Exactly what that release's option table has (NVIDIA/nvidia-installer option_table.h),
    # user space only: NVIDIA's installer neither builds nor loads a module.
    assert nvidia_options.unknown(version, argv) == []
    assert "--no-kernel-module" in argv
    return done.event("kernel_modules_build_started")["argv"]


def _make_var(make_argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in make_argv if a.startswith(f"{name}="))


def test_real_535_proprietary_built_through_the_sandbox(real_535, real_parts, headers):
    make = _check_build(real_535, real_parts.main.version, headers.abi, firmware=True)
    # NVIDIA's whole build: every module of kernel/ (the direct build makes objects only).
    assert sorted(p.name for p in (real_535.install_dir / "drivers").glob("*.ko")) == MODULE_FILES
    assert make[:2] == ["make", "-C"] and make[2].endswith("/kernel") and make[-1] == "modules"
    source, output = _make_var(make, "SYSSRC"), _make_var(make, "SYSOUT")
    assert source.endswith(str(headers.source)) and output.endswith(str(headers.output))
    assert modinfo(real_535.install_dir / "drivers/nvidia.ko", "firmware").split() == [
        f"nvidia/{real_parts.main.version}/gsp_tu10x.bin",
        f"nvidia/{real_parts.main.version}/gsp_ga10x.bin"]


def test_sandbox_build_lost_no_compiler_probe(real_535, real_parts, headers):
    """kbuild's recorded flags for one object of each module, built through our sandbox
    (the pod's overlay rootfs, whose own /dev is empty) and directly on this machine
    (kbuild's single-object goals: the flags are those of the whole build, whose objects
    kbuild compiles with the same command line)."""
    direct = kbuild.cached_objects(real_parts.main.kernel, headers, OBJECTS)
    make = real_535.event("kernel_modules_build_started")["argv"]
    node_source, node_output = _make_var(make, "SYSSRC"), _make_var(make, "SYSOUT")
    logged = kbuild.logged_commands(real_535.build_log)
    for obj in OBJECTS:
        ours = kbuild.flags_of(*logged[obj], obj, {node_source: "<src>", node_output: "<out>"})
        theirs = kbuild.cmd_flags(direct, obj, {str(headers.source): "<src>",
                                                str(headers.output): "<out>"})
        assert ours == theirs, obj
        assert [f for f in kbuild.PROBED_FLAGS if f not in ours] == [], obj


def test_real_535_open_fails_to_build_on_this_kernel_and_says_why(real_535_open, real_parts,
                                                                   headers):
    """NVIDIA's 535.261.03 open modules call pci_resize_resource() with three arguments;
    Debian's 6.1.0-56 kernel has the four-argument one (a stable backport), and their
    conftest does not probe it: the real build fails. The installer must say so in one
    line naming the compiler's error, exit 7, and install nothing."""
    assert real_535_open.rc == 7
    final = real_535_open.event("install_failed")
    assert final["error_class"] == "build" and final["step"] == "build_driver"
    assert "error: too few arguments to function" in final["error"]
    assert "pci_resize_resource" in final["error"]
    assert final["error"].startswith("building NVIDIA's kernel modules failed (make exit 2)")
    make = real_535_open.event("kernel_modules_build_started")["argv"]
    assert make[2].endswith("/kernel-open")
    # NVIDIA's installer never ran: the build failed first.
    assert not [e for e in real_535_open.events if e.get("event") == "nvidia_installer_started"]
    assert not (real_535_open.install_dir / ".cache").exists()
    assert not list((real_535_open.install_dir / "drivers").glob("*.ko"))
    # Not our sandbox: built directly on this machine, the same source fails the same way
    # (the failing object only: kbuild's single-object goal, after the same conftest).
    direct = kbuild.cached_objects(real_parts.main.kernel_open, headers, [kbuild.OPEN_535_FAILING_OBJECT],
                                   allow_failure=True)
    assert (direct / kbuild.STATUS).read_text().strip() != "0"
    direct_log = (direct / kbuild.BUILD_LOG).read_text(errors="replace")
    assert "too few arguments to function" in direct_log and "pci_resize_resource" in direct_log


def test_real_470_built_through_the_sandbox(real_470, real_parts, headers):
    make = _check_build(real_470, real_parts.legacy.version, headers.abi, firmware=False)
    assert make[2].endswith("/kernel")  # R470 has no open modules


# ---------------------------------------------------- real nvidia-smi, real NVML


def test_real_nvidia_smi_failures_are_classified(real_parts, tmp_path):
    """Debian's nvidia-smi + libnvidia-ml1 on a machine without the driver, through the
    installer's verify step: each real failure text gets its exit code and hint."""
    v = real_parts.main.version
    tree = Tree(tmp_path / "install")
    (tree.bin).mkdir(parents=True)
    (tree.lib64).mkdir()
    smi = tree.bin / "nvidia-smi"
    smi.write_bytes(real_parts.main.nvidia_smi.read_bytes())
    smi.chmod(0o755)
    kernel = KernelState()
    from installer.host.runner import Runner

    # libnvidia-ml.so.1 not found: NVIDIA-SMI couldn't find libnvidia-ml.so (exit 12).
    with pytest.raises(VerifyError) as err:
        nvidia_smi(tree, Runner(env=kernel.seam_env()), lib_dir=tree.lib64)
    assert "couldn't find libnvidia-ml.so" in err.value.message
    assert "libnvidia-ml.so.1 does not resolve" in err.value.hint
    assert err.value.exit_code == 9
    # With the real NVML: no driver to talk to (exit 9 from nvidia-smi).
    lib = tree.lib64 / f"libnvidia-ml.so.{v}"
    lib.write_bytes(real_parts.main.libnvidia_ml.read_bytes())
    (tree.lib64 / "libnvidia-ml.so.1").symlink_to(lib.name)
    with pytest.raises(VerifyError) as err:
        nvidia_smi(tree, Runner(env=kernel.seam_env()), lib_dir=tree.lib64)
    assert "couldn't communicate with the NVIDIA driver" in err.value.message
    assert "nvidia kernel module is not loaded" in err.value.hint

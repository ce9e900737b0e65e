"""The installer itself, in Debian's arm64 kernel under qemu-system-aarch64, installs the
arm64 bundles ``bundle build --arch arm64`` made on this amd64 machine (open and
proprietary: tests/arm64/bundle_cross.py) from a ``file://`` directory with its
``index.json``, ``--prebuilt-only``: no compiler, no .run. NVIDIA's nvidia.ko is accepted
and its init finds no GPU, the same outcome tests/vm asserts for x86_64: exit 8 with
the installer's one-line message, nothing left loaded but the kernel's own ``drm``.

The guest (tests/arm64/guest.py): one initramfs of Debian's arm64 python3, kmod and
busybox, the installer's wheels for aarch64 and this tree's ``installer/``. One boot
runs both installs (about 1.5-3 min under TCG: python's imports dominate).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from installer.bundle import index
from tests.arm64 import bundle_cross, guest, qemu_boot
from tests.arm64.bundle_cross import modinfo
from tests.arm64.conftest import TYPES

GUEST_TIMEOUT_S = 900
pytestmark = [
    pytest.mark.timeout(2 * bundle_cross.BUILD_TIMEOUT_S + GUEST_TIMEOUT_S + 300),
    pytest.mark.skipif(shutil.which(bundle_cross.CC) is None,
                       reason=f"no {bundle_cross.CC}: make deps-tiers installs "
                       "gcc-aarch64-linux-gnu"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the build jail needs root"),
]  # one boot, two installs, python under TCG on 2 shared cores
NO_GPU = ("the driver built and the kernel accepted nvidia.ko, but no NVIDIA GPU is attached "
          "to this node (kernel: NVRM: No NVIDIA GPU found.)")  # as tests/vm/test_real_modules


@pytest.fixture(scope="module")
def console(parts, built, tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("arm64-guest")
    bundles = work / "bundles"
    bundles.mkdir()
    installs, needs = [], set()
    for module_type in TYPES:
        out, record = built[module_type]
        path = out / record["cli"]["bundle"].rsplit("/", 1)[1]
        shutil.copy(path, bundles / path.name)
        version = record["cli"]["driver_version"]
        installs.append((module_type, version, bundle_cross.run_name(version)))
        staged = work / f"ko-{module_type}"
        staged.mkdir()
        subprocess_extract(path, staged)
        needs |= {n for n in modinfo(staged / "drivers/nvidia.ko", "depends").split(",") if n}
    index.update(bundles)  # what a build Job publishes beside the bundles
    vmlinuz, _busybox, modules = qemu_boot.boot_parts(parts)
    root = guest.assemble(parts, modules, bundles, sorted(needs), work / "root",
                          guest.install_init(installs))
    initrd = guest.cpio(root, work / "initrd.cpio")
    shutil.rmtree(root)
    text, took = qemu_boot.boot(vmlinuz, initrd, work / "console.log", memory_mib=3072,
                                timeout_s=GUEST_TIMEOUT_S, markers=(guest.BEGIN, guest.END))
    print(f"\n[arm64] guest boot + two installs: {took:.0f} s\n{text}")
    return text


def subprocess_extract(bundle, dest) -> None:
    """drivers/nvidia.ko of a bundle (tar.zst), to read what it depends on."""
    subprocess.run(["tar", "--zstd", "-xf", str(bundle), "-C", str(dest), "drivers/nvidia.ko"],
                   check=True)


def section(console: str, module_type: str) -> list[str]:
    start = console.index(f"install {module_type} rc=")
    return console[start:console.index(f"=== end {module_type}", start)].splitlines()


@pytest.mark.skipif(shutil.which(qemu_boot.QEMU) is None,
                    reason="no qemu-system-aarch64: make deps-tiers installs qemu-system-arm")
@pytest.mark.parametrize("module_type", TYPES)
def test_the_installer_installs_the_arm64_bundle_up_to_no_gpu(parts, console, module_type):
    assert f"machine=aarch64 release={parts.abi}" in console
    lines = section(console, module_type)
    assert lines[0] == f"install {module_type} rc=8", lines
    final = json.loads(lines[1])
    assert final["event"] == "install_failed" and final["os"] == "debian", final
    assert final["exit_code"] == 8 and final["error_class"] == "module_load", final
    assert final["error"] == NO_GPU and final["step"] == "load_modules", final
    # the bundle staged (1 prebuilt_bundle_staged event), nothing compiled (0 builds)
    assert lines[2:4] == ["1", "0"], lines
    kernel = "\n".join(lines[4:])
    assert "NVRM: No NVIDIA GPU found." in kernel
    for bad in ("Unknown symbol", "disagrees about version", "Invalid module format",
                "Exec format error"):
        assert bad not in kernel, kernel
    # /proc/modules after the run: the kernel's own drm stays, no nvidia module half-loaded
    loaded = [ln.split()[0] for ln in lines if " Live " in ln]
    assert "drm" in loaded and not [m for m in loaded if m.startswith("nvidia")], loaded

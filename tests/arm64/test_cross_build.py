"""NVIDIA's real open kernel modules (Debian's nvidia-open-kernel-source for arm64)
cross-built for Debian's arm64 kernel on this amd64 machine, in the installer's build jail,
as an arm64 bundle build would (issue 42 §2): ``make_argv(..., cross=AARCH64)`` through
``nvidia_run.build_modules``. Checked with readelf (EM_AARCH64) and modinfo (vermagic).

``make test-arm64``: provisions the parts once (tests/arm64/provision.py, 1-2 minutes
cold), builds once per parts/compiler (cached; 5-12 minutes on 2 shared cores), boots
(seconds); measured in docs/arm64.md. Skipped when the cross compiler
(``gcc-aarch64-linux-gnu``, ``make deps-tiers``), root (the jail) or the archive is
missing (NDI_ARM64_REQUIRED=1: fail instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from installer.base import cpuarch
from installer.driver import module_build, nvidia_run
from installer.host.installdir import Tree
from installer.host.runner import Runner
from installer.kmod.headers import KernelTree
from tests.arm64 import qemu_boot
from tests.arm64.provision import CACHE_ROOT, CrossParts, differing_sources, provision
from tests.debapt import ProvisionError

BUDGET_S = 1500  # the build's own bound (measured on 2 cores: docs/arm64.md)
CC = "aarch64-linux-gnu-gcc-12"  # what Debian's .kernelvariables names: $(CROSS_COMPILE)gcc-12

pytestmark = [
    pytest.mark.timeout(BUDGET_S + qemu_boot.BOOT_TIMEOUT_S + 300),  # provision + build + boot
    pytest.mark.skipif(shutil.which(CC) is None,
                       reason=f"no {CC}: make deps-tiers installs gcc-aarch64-linux-gnu"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the build jail needs root"),
]


@pytest.fixture(scope="module")
def parts() -> CrossParts:
    """Skipped when the archive cannot be had (no network); NDI_ARM64_REQUIRED=1: fail."""
    try:
        return provision()
    except ProvisionError as exc:
        if os.environ.get("NDI_ARM64_REQUIRED") == "1":
            raise
        pytest.skip(f"Debian's arm64 parts cannot be had: {str(exc)[:300]}")


@pytest.fixture(scope="module")
def built(parts, tmp_path_factory) -> tuple[Path, float]:
    """The arm64 tree copied into an extract dir and built in the jail: (drivers, the
    build's seconds). Kept in the cache per (package versions, make argv, compiler):
    NDI_ARM64_NO_CACHE=1 builds again."""
    work = tmp_path_factory.mktemp("arm64")
    extract = work / "extract"
    kernel = KernelTree(Path(parts.source), Path(parts.output))
    argv = module_build.make_argv(f"{nvidia_run.EXTRACT_IN_CHROOT}/kernel-open", kernel,
                                  os.cpu_count() or 1, cross=cpuarch.AARCH64)
    compiler = subprocess.run([CC, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(json.dumps([parts.versions, argv[:5] + argv[6:], compiler])
                         .encode()).hexdigest()[:20]
    cached = CACHE_ROOT / "builds" / key
    if (cached / "seconds").is_file() and os.environ.get("NDI_ARM64_NO_CACHE") != "1":
        return cached, float((cached / "seconds").read_text())
    shutil.copytree(parts.open_tree, extract / "kernel-open", symlinks=True)
    staging = Tree(work / "staging")
    staging.root.mkdir()
    t0 = time.monotonic()
    nvidia_run.build_modules(Runner(), extract_dir=extract, staging=staging, argv=argv,
                             tree_dir="kernel-open", kernel_release=parts.abi,
                             binds=parts.binds(), env={})
    took = time.monotonic() - t0
    print(f"\n[arm64] cross build of the open modules: {took:.0f} s")
    assert took < BUDGET_S
    shutil.rmtree(cached, ignore_errors=True)
    shutil.copytree(staging.drivers, cached)
    (cached / "seconds").write_text(f"{took:.1f}\n")  # last: the stamp
    return cached, took


def test_the_open_sources_differ_between_architectures_only_in_the_prebuilt_cores(parts):
    """Debian's nvidia-open-kernel-source is built per architecture: the C sources are the
    same, the OS-agnostic cores (nv-kernel.o_binary, nv-modeset-kernel.o_binary) are each
    architecture's objects. An arm64 bundle needs the arm64 package, not the amd64 one."""
    assert differing_sources(parts.open_tree, parts.open_tree_amd64) == [
        "nvidia-modeset/nv-modeset-kernel.o_binary", "nvidia/nv-kernel.o_binary"]
    assert _machine(parts.open_tree / "nvidia/nv-kernel.o_binary") == "AArch64"
    assert _machine(parts.open_tree_amd64 / "nvidia/nv-kernel.o_binary") == \
        "Advanced Micro Devices X86-64"


def test_the_open_modules_cross_build_for_the_arm64_kernel(parts, built):
    drivers, _took = built
    names = sorted(p.name for p in drivers.glob("*.ko"))
    assert names == ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko",
                     "nvidia-uvm.ko", "nvidia.ko"] or names == sorted(
        n for n in module_build.MODULE_FILES if (drivers / n).exists())
    assert "nvidia.ko" in names
    for ko in drivers.glob("*.ko"):
        assert _machine(ko) == "AArch64", ko
        vermagic = _modinfo(ko, "vermagic")
        # The arm64 kernel's release and its modversions/aarch64 flags (vermagic.h).
        assert vermagic.split()[0] == parts.abi, (ko, vermagic)
        assert re.search(r"\baarch64\b", vermagic), (ko, vermagic)
    version = parts.versions["nvidia-open-kernel-source:arm64"].split("-")[0]
    assert _modinfo(drivers / "nvidia.ko", "version") == version


def _machine(path: Path) -> str:
    out = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"^\s*Machine:\s+(.+)$", out, re.M)
    assert m, out
    return m.group(1).strip()


def _modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(shutil.which(qemu_boot.QEMU) is None,
                    reason="no qemu-system-aarch64: make deps-tiers installs qemu-system-arm")
def test_the_arm64_kernel_loads_the_cross_built_nvidia_ko_up_to_no_gpu(parts, built, tmp_path):
    """Under qemu-system-aarch64 (no GPU on its virt machine) nvidia.ko links and runs its
    init: NVIDIA's own "No NVIDIA GPU found." (nv.c) and ENODEV, not a format or symbol
    error (which insmod would report before any NVRM line)."""
    drivers, _took = built
    vmlinuz, busybox, modules = qemu_boot.boot_parts(parts)
    needs = [n for n in _modinfo(drivers / "nvidia.ko", "depends").split(",") if n]
    deps = qemu_boot.in_tree_deps(modules, needs)  # drm (drm_gem_object_free) on 6.1
    initrd = qemu_boot.initramfs(tmp_path, busybox, [*deps, drivers / "nvidia.ko"])
    console, took = qemu_boot.boot(vmlinuz, initrd, tmp_path / "console.log")
    print(f"\n[arm64] qemu boot + insmod: {took:.0f} s\n{console}")
    assert f"machine=aarch64 release={parts.abi}" in console
    assert "NVRM: No NVIDIA GPU found." in console
    # busybox insmod exits with the errno: ENODEV (19), "No such device".
    assert "insmod nvidia.ko rc=19\n" in console and "No such device" in console
    for bad in ("Unknown symbol", "disagrees about version", "Invalid module format",
                "Exec format error"):
        assert bad not in console, console

"""NVIDIA's real arm64 535 kernel modules, open (Debian's nvidia-open-kernel-source
535.261.03) and proprietary (nvidia-kernel-source 535.309.01), built on this amd64 machine
by the installer's own ``bundle build --arch arm64`` (tests/arm64/bundle_cross.py: why a
cross build, not a native one under emulation), then taken apart as an arm64 node's
install takes a bundle (``installer.bundle.fetch.unpack``), checked with readelf
(EM_AARCH64) and modinfo (vermagic), refused by an x86_64 node (exit 6), and insmod'ed by
Debian's arm64 kernel under qemu-system-aarch64 up to NVIDIA's "No NVIDIA GPU found".

``make test-arm64``: provisions the parts once (tests/arm64/provision.py, 1-2 minutes
cold), builds each bundle once per content (cached; minutes each on 2 shared cores),
boots (seconds each); measured in docs/arm64.md. Skipped when the cross compiler
(``gcc-aarch64-linux-gnu``, ``make deps-tiers``), root (the jail) or the archive is
missing (NDI_ARM64_REQUIRED=1: fail instead).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from installer.base.errors import ExitCode, IntegrityError
from installer.bundle.fetch import unpack
from installer.driver import module_build
from installer.host.installdir import Tree
from installer.records.bundle_manifest import BundleKey
from tests.arm64 import bundle_cross
from tests.arm64.bundle_cross import elf_machine, modinfo
from tests.arm64.conftest import TYPES
from tests.arm64.provision import differing_sources

CC = bundle_cross.CC

pytestmark = [
    pytest.mark.timeout(2 * bundle_cross.BUILD_TIMEOUT_S + 300),  # provision + two cold builds
    pytest.mark.skipif(shutil.which(CC) is None,
                       reason=f"no {CC}: make deps-tiers installs gcc-aarch64-linux-gnu"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the build jail needs root"),
]


@pytest.fixture(scope="module", params=TYPES)
def bundle(request, parts, built, tmp_path_factory) -> dict:
    """One module type's arm64 bundle (conftest ``built``), unpacked as an arm64 node's
    install unpacks it: {"type", "path", "key", "cli", "seconds", "drivers", "root"}."""
    module_type = request.param
    out, record = built[module_type]
    print(f"\n[arm64] bundle build --arch arm64 ({module_type}): {record['seconds']:.0f} s "
          "(when it was built)")
    cli = record["cli"]
    path = out / Path(cli["bundle"]).name
    key = BundleKey.of(cli["driver_version"], cli["kernel_release"], cli["module_type"])
    staging = Tree(tmp_path_factory.mktemp(f"node-{module_type}") / "staging")
    staging.root.mkdir()
    unpack(path, staging, key, parts.abi, arch="aarch64")
    return {"type": module_type, "path": path, "key": key, "cli": cli, "root": staging.root,
            "drivers": staging.root / "drivers", "seconds": record["seconds"]}


def test_the_open_sources_differ_between_architectures_only_in_the_prebuilt_cores(parts):
    """Debian's nvidia-open-kernel-source is built per architecture: the C sources are the
    same, the OS-agnostic cores (nv-kernel.o_binary, nv-modeset-kernel.o_binary) are each
    architecture's objects. An arm64 bundle needs the arm64 package, not the amd64 one."""
    assert differing_sources(parts.open_tree, parts.open_tree_amd64) == [
        "nvidia-modeset/nv-modeset-kernel.o_binary", "nvidia/nv-kernel.o_binary"]
    assert elf_machine(parts.open_tree / "nvidia/nv-kernel.o_binary") == "AArch64"
    assert elf_machine(parts.open_tree_amd64 / "nvidia/nv-kernel.o_binary") == \
        "Advanced Micro Devices X86-64"


def test_bundle_build_cross_compiles_nvidias_arm64_modules_for_the_arm64_kernel(parts, bundle):
    cli, drivers = bundle["cli"], bundle["drivers"]
    assert cli["arch"] == "aarch64" and cli["kernel_release"] == parts.abi
    assert cli["module_type"] == bundle["type"]
    assert cli["compiler"].startswith("aarch64-linux-gnu-gcc"), cli["compiler"]
    names = sorted(p.name for p in drivers.glob("*.ko"))
    assert "nvidia.ko" in names and set(names) <= set(module_build.MODULE_FILES), names
    for ko in drivers.glob("*.ko"):
        assert elf_machine(ko) == "AArch64", ko
        vermagic = modinfo(ko, "vermagic")
        # The arm64 kernel's release and its modversions/aarch64 flags (vermagic.h).
        assert vermagic.split()[0] == parts.abi, (ko, vermagic)
        assert re.search(r"\baarch64\b", vermagic), (ko, vermagic)
    assert modinfo(drivers / "nvidia.ko", "version") == cli["driver_version"]
    assert modinfo(drivers / "nvidia.ko", "license") == (
        "Dual MIT/GPL" if bundle["type"] == "open" else "NVIDIA")
    # NVIDIA's arm64 user space, installed by the .run's nvidia-installer in the jail.
    assert elf_machine(bundle["root"] / "bin/nvidia-smi") == "AArch64"


def test_an_x86_64_node_refuses_the_arm64_bundle_in_one_line(bundle, tmp_path):
    staging = Tree(tmp_path / "staging")
    staging.root.mkdir()
    with pytest.raises(IntegrityError) as exc:
        unpack(bundle["path"], staging, bundle["key"], bundle["key"].kernel_release,
               arch="x86_64")
    assert exc.value.exit_code == ExitCode.INTEGRITY
    assert str(exc.value) == (f"prebuilt bundle {bundle['key'].name()} is built for aarch64, "
                              "this node is x86_64; nothing was installed")
    assert not list(staging.root.iterdir())

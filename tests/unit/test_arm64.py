"""Arm64 GPU nodes (issue 42 §1): the node's architecture read once and every name that
follows it, on fixture nodes whose fake kernel says ``aarch64`` (/proc/sys/kernel/arch, as
a 6.1+ kernel publishes it) with a Grace superchip's GPU on the PCI bus. The x86_64 names
are pinned beside them: an x86_64 node plans exactly what it did before."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from installer.base import cpuarch
from installer.base.errors import ExitCode, IntegrityError, UnsupportedHostError, UsageError
from installer.detect import context, probe
from installer.distros.headers_build_flow import HeadersBuildFlow
from installer.distros.ubuntu import Ubuntu
from installer.driver import module_build
from installer.driver.nvidia_urls import named_arch, named_version, run_url
from installer.host import gpus
from installer.jail import run_in_jail as sandbox
from installer.kmod.headers import KernelTree
from installer.kmod.kernel import KernelState
from installer.kmod.moduleargs import ModuleArg
from installer.services import fabric, fabricmanager
from installer.settings import Settings, validate
from installer.steps import fabric as fabric_steps
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import UBUNTU_KERNEL, build_ubuntu_node

GB200, GH200, H100 = "0x2941", "0x2342", "0x2330"
V = "580.82.07"
CDMM = "nvidia.NVreg_CoherentGPUMemoryMode=driver"


class Node:
    """A fixture Ubuntu node whose fake kernel says ``machine``."""

    def __init__(self, tmp_path: Path, monkeypatch, machine: str | None, gpu: str):
        self.node = build_ubuntu_node(tmp_path / "node")
        self.kernel = FakeKernel(tmp_path / "kernel", UBUNTU_KERNEL)
        if machine:
            self.kernel.set_machine(machine)
        self.kernel.add_gpu(device=gpu)
        self.kernel.activate(monkeypatch)
        self.tesla = tmp_path / "tesla"

    def ctx(self, **settings):
        settings.setdefault("driver_base_url", f"file://{self.tesla}")
        return context(validate(Settings(host_root=self.node.root,
                                         install_dir=self.node.install_dir, **settings)))


@pytest.fixture
def gb200(tmp_path, monkeypatch):
    return Node(tmp_path, monkeypatch, "aarch64", GB200)


def test_the_names_of_each_architecture_are_nvidias_and_debians():
    """gpu-driver-container's DRIVER_ARCH (amd64->x86_64, arm64->aarch64) and OS_ARCH
    (arm64->sbsa); Debian's triplets and dpkg names; Kbuild's arch/ dirs."""
    a = cpuarch.AARCH64
    assert (a.nvidia, a.redist, a.triplet, a.debian, a.kbuild, a.cross_prefix) == (
        "aarch64", "linux-sbsa", "aarch64-linux-gnu", "arm64", "arm64", "aarch64-linux-gnu-")
    x = cpuarch.X86_64
    assert (x.nvidia, x.redist, x.triplet, x.debian, x.kbuild) == (
        "x86_64", "linux-x86_64", "x86_64-linux-gnu", "amd64", "x86")
    assert cpuarch.from_machine("aarch64\n") is a and cpuarch.from_name("arm64") is a


def test_an_architecture_without_nvidia_drivers_is_an_unsupported_host():
    with pytest.raises(UnsupportedHostError, match="'ppc64le'.*x86_64 and aarch64") as exc:
        cpuarch.from_machine("ppc64le")
    assert exc.value.exit_code == ExitCode.UNSUPPORTED_HOST


def test_the_machine_is_the_kernels_arch_sysctl_else_uname(tmp_path):
    kernel = FakeKernel(tmp_path / "k")
    state = KernelState(kernel.proc_dir, kernel.sys_dir, kernel.dev_dir)
    assert state.machine() == os.uname().machine  # a 5.15 kernel: no kernel.arch
    kernel.set_machine("aarch64")
    assert state.machine() == "aarch64"


def test_the_run_file_of_each_architecture_lies_in_the_one_version_directory():
    base = "https://127.0.0.1:1/tesla"
    assert run_url(base, V) == f"{base}/{V}/NVIDIA-Linux-x86_64-{V}.run"
    arm = run_url(base, V, "aarch64")
    assert arm == f"{base}/{V}/NVIDIA-Linux-aarch64-{V}.run"
    assert (named_version(arm), named_arch(arm)) == (V, "aarch64")
    assert named_arch(run_url(base, V)) == "x86_64"


def test_the_fabric_manager_of_arm_servers_is_nvidias_linux_sbsa_archive():
    base = "https://127.0.0.1:1/redist"
    assert fabricmanager.archive_url(base, V, "linux-sbsa") == (
        f"{base}/fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-{V}-archive.tar.xz")
    assert fabricmanager.archive_url(base, V) == (
        f"{base}/fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{V}-archive.tar.xz")
    sbsa = f"fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-{V}-archive.tar.xz"
    doc = json.dumps({"fabricmanager": {"linux-sbsa": {"relative_path": sbsa,
                                                       "sha256": "b" * 64}}})
    assert fabricmanager.pinned_sha256(doc, V, "linux-sbsa") == "b" * 64
    with pytest.raises(IntegrityError, match="no fabric manager for linux-x86_64"):
        fabricmanager.pinned_sha256(doc, V)  # an x86_64 node never takes the sbsa one


def test_an_arm_nvlink_node_plans_the_sbsa_fabric_manager(tmp_path):
    fake = FakeKernel(tmp_path / "k")
    fake.add_nvlink5_bridge()
    # What detect.probe records of the node, as the plan reads it.
    ctx = SimpleNamespace(node=SimpleNamespace(fabric_present=fabric.detect(fake.sys_dir).present),
                          arch=cpuarch.AARCH64)
    (step,) = fabric_steps.for_node(ctx, V)
    assert f"fabricmanager-linux-sbsa-{V}-archive" in step.detail


def test_the_jail_harvests_the_aarch64_library_dir_too():
    assert "usr/lib/aarch64-linux-gnu" in sandbox.LIB_DIRS
    assert sandbox.LIB_DIRS[:3] == ("usr/lib/x86_64-linux-gnu", "usr/lib64",
                                    "lib/x86_64-linux-gnu")  # x86_64's, as before, first


def test_grace_parts_are_the_c2c_superchips_and_cdmm_exists_from_580_65_06():
    found = [gpus.PciGpu("0000:01:00.0", d, "0x030200") for d in (GH200, GB200, H100)]
    assert [g.device_id for g in gpus.grace_parts(found)] == [GH200, GB200]
    assert gpus.has_cdmm_option("580.65.06") and gpus.has_cdmm_option("595.45.04")
    assert not gpus.has_cdmm_option("575.57.08") and not gpus.has_cdmm_option("latest")


def test_install_dry_run_on_a_gb200_node_plans_the_aarch64_run_and_cdmm(gb200):
    """Issue 42's first 'done means' (the sbsa fabric manager: the test above)."""
    ctx = gb200.ctx()
    assert ctx.arch is cpuarch.AARCH64
    plan = HeadersBuildFlow(Ubuntu).plan(probe(ctx))
    assert plan.summary["driver_url"] == (
        f"file://{gb200.tesla}/{V}/NVIDIA-Linux-aarch64-{V}.run")
    assert plan.summary["kernel_module_type"] == "open"  # Blackwell: required
    assert [str(a) for a in ctx.settings.module_args] == [CDMM]


def test_a_driver_url_of_the_other_architecture_is_refused_before_any_fetch(gb200):
    url = f"https://127.0.0.1:1/m/NVIDIA-Linux-x86_64-{V}.run"
    with pytest.raises(UsageError, match="names an x86_64 driver, and this node is aarch64") as e:
        gb200.ctx(driver_url=url, driver_base_url=None)
    assert e.value.exit_code == ExitCode.USAGE


def test_the_operators_coherent_memory_mode_is_kept(gb200):
    numa = ModuleArg.parse("nvidia.NVreg_CoherentGPUMemoryMode=numa")
    ctx = gb200.ctx(module_args=(numa,))
    assert ctx.settings.module_args == (numa,)


def test_a_driver_without_the_option_gets_no_cdmm(tmp_path, monkeypatch):
    """GH200 on R570: nvidia.ko has no NVreg_CoherentGPUMemoryMode before 580.65.06."""
    ctx = Node(tmp_path, monkeypatch, "aarch64", GH200).ctx(driver_version="570.133.20")
    assert ctx.settings.module_args == ()
    assert HeadersBuildFlow(Ubuntu).plan(probe(ctx)).summary["driver_url"].endswith(
        "/NVIDIA-Linux-aarch64-570.133.20.run")


def test_an_x86_64_node_plans_as_before(tmp_path, monkeypatch):
    ctx = Node(tmp_path, monkeypatch, "x86_64", H100).ctx()
    assert ctx.arch is cpuarch.X86_64 and ctx.settings.module_args == ()
    assert HeadersBuildFlow(Ubuntu).plan(probe(ctx)).summary["driver_url"].endswith(
        f"/{V}/NVIDIA-Linux-x86_64-{V}.run")


def test_a_cross_build_passes_kbuilds_arch_and_cross_prefix_and_a_native_one_does_not():
    tree = KernelTree(Path("/usr/src/linux-headers-6.1.0-56-common"),
                      Path("/usr/src/linux-headers-6.1.0-56-arm64"))
    native = module_build.make_argv("/x/kernel-open", tree, 2)
    assert native == ["make", "-C", "/x/kernel-open", f"SYSSRC={tree.source}",
                      f"SYSOUT={tree.output}", "-j2", "modules"]  # as before
    cross = module_build.make_argv("/x/kernel-open", tree, 2, cross=cpuarch.AARCH64)
    assert cross == [*native[:-1], "ARCH=arm64", "CROSS_COMPILE=aarch64-linux-gnu-", "modules"]


def test_detect_reports_the_nodes_architecture(gb200):
    from installer import detect

    report = detect.run(validate(Settings(host_root=gb200.node.root,
                                          install_dir=gb200.node.install_dir)))
    assert report["arch"] == "aarch64" and report["gpus"][0]["name"] == "NVIDIA GB200"

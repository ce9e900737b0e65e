"""COS on arm64 (issue 42), as Google's cos-gpu-installer v2 finds an Arm build's artifacts:
under ``<BUILD_ID>/<board>/`` with the board ``lakitu-arm64`` from /etc/lsb-release
(cos/tools src/pkg/cos/artifacts.go NewGCSDownloader; installer/distros/cos/boards.py cites
each fact), prebuilt signed modules only. Fixture nodes: a COS build whose kernel says
``aarch64`` (/proc/sys/kernel/arch) with a GB200 (0x2941) on the PCI bus; a file:// bucket.
The dry run through the pod and the local artifact server: tests/integration/test_cos_arm64.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.base import cpuarch
from installer.base.errors import ExitCode, UnsupportedHostError
from installer.detect import context, probe
from installer.distros.cos import boards
from installer.distros.cos.artifacts import Artifacts
from installer.distros.cos.flow import CosFlow
from installer.distros.cos.options import DEFAULT_ARTIFACTS_URL, CosOptions
from installer.kmod.kernel import KernelState
from installer.settings import Settings, validate
from tests.cosbucket import ARM_ALIASES, ARM_LSB_RELEASE, ARM_V, Bucket
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import COS_113_LSB_RELEASE, COS_BUILD_ID, COS_KERNEL, build_cos_node

GB200 = "0x2941"
V = ARM_V
CDMM = "nvidia.NVreg_CoherentGPUMemoryMode=driver"


class ArmCos:
    """A COS arm64 node with a GB200, and its build's artifacts in a file:// bucket."""

    def __init__(self, tmp_path: Path, *, machine: str = "aarch64",
                 lsb_release: str = ARM_LSB_RELEASE, prebuilt: bool = True):
        self.node = build_cos_node(tmp_path / "node", lsb_release=lsb_release)
        self.kernel = FakeKernel(tmp_path / "kernel", COS_KERNEL)
        self.kernel.set_machine(machine)
        self.kernel.add_gpu(device=GB200)
        self.bucket = Bucket(tmp_path / "bucket", board=boards.ARM_BOARD,
                             aliases=dict(ARM_ALIASES),
                             prebuilt_versions=(V,) if prebuilt else (),
                             toolchain_env="CC=aarch64-cros-linux-gnu-clang\n")
        self.tesla = tmp_path / "tesla"
        self.tools_dir = tmp_path / "tools"

    def ctx(self, *, preload: bool = False, base_url: bool = True, **settings):
        self.bucket.write()
        cos = CosOptions(artifacts_url=self.bucket.file_url(), toolchain_dir=self.tools_dir,
                         preload=preload)
        s = validate(Settings(host_root=self.node.root, install_dir=self.node.install_dir,
                              distro_options=(cos,),
                              driver_base_url=f"file://{self.tesla}" if base_url else None,
                              **settings))
        kernel = KernelState(self.kernel.proc_dir, self.kernel.sys_dir, self.kernel.dev_dir)
        return probe(context(s, kernel))


def refusal(ctx) -> UnsupportedHostError:
    with pytest.raises(UnsupportedHostError) as exc:
        CosFlow().plan(ctx)
    assert exc.value.exit_code == ExitCode.UNSUPPORTED_HOST == 3
    assert "\n" not in exc.value.message
    return exc.value


def test_the_arm_board_is_lakitu_arm64_and_its_artifacts_are_v2s_board_prefix():
    """artifacts.go NewGCSDownloader: prefix <BuildNumber>/<Board>; devenv.sh: lakitu-arm64
    is arm64, any other board x86. The board-less default (x86_64's files) is kept there."""
    assert boards.arch_of_board("lakitu-arm64") is cpuarch.AARCH64
    assert boards.arch_of_board("lakitu") is cpuarch.X86_64
    assert boards.artifacts_template(DEFAULT_ARTIFACTS_URL, cpuarch.AARCH64) == (
        "https://storage.googleapis.com/cos-tools/{build_id}/{board}")
    assert boards.artifacts_template(DEFAULT_ARTIFACTS_URL, cpuarch.X86_64) == (
        DEFAULT_ARTIFACTS_URL)
    mine = "https://127.0.0.1:1/mirror/{build_id}"
    assert boards.artifacts_template(mine, cpuarch.AARCH64) == mine  # the operator's: kept


def test_google_offers_the_precompiled_run_its_mirror_and_compiling_on_x86_64_only():
    """installer.go precompiledDriverTemplate and installerURLTemplate name x86_64 files
    only; devenv.sh gpu_build refuses non-x86 kernels."""
    for offered in (boards.offers_precompiled, boards.uses_google_mirror,
                    boards.offers_compile):
        assert offered(cpuarch.X86_64) and not offered(cpuarch.AARCH64)


def test_an_arm64_cos_node_plans_the_boards_prebuilt_modules_and_the_aarch64_run(tmp_path):
    arm = ArmCos(tmp_path)
    ctx = arm.ctx()
    assert ctx.arch is cpuarch.AARCH64 and ctx.host_info.board == "lakitu-arm64"
    plan = CosFlow().plan(ctx)
    base = f"file://{arm.bucket.root}/{COS_BUILD_ID}/lakitu-arm64"
    s = plan.summary
    assert plan.kind == "fresh" and s["artifacts_url"] == base
    assert (s["driver_version"], s["version_source"]) == (V, f"{base}/gpu_default_version")
    assert s["module_source"] == "prebuilt" and s["kernel_module_type"] == "open"
    assert s["prebuilt_modules_url"] == f"{base}/nvidia-drivers-{V}.tgz"
    assert s["driver_url"] == f"file://{arm.tesla}/{V}/NVIDIA-Linux-aarch64-{V}.run"
    assert "toolchain_url" not in s and "kernel_headers_url" not in s  # no compile
    fetch = next(st for st in plan.steps if st.name == "fetch_artifacts").detail
    assert f"{base}/nvidia-drivers-{V}.tgz" in fetch and "x86_64" not in fetch
    assert [str(a) for a in ctx.settings.module_args] == [CDMM]


def test_google_mirror_is_not_asked_for_an_aarch64_run(tmp_path, monkeypatch):
    """No --driver-base-url: x86_64 COS takes Google's mirror, aarch64 NVIDIA's host."""
    from installer.distros.cos import mirror

    monkeypatch.setattr(mirror, "gce_zone", lambda *a, **k: "europe-west4-a")
    url = CosFlow().plan(ArmCos(tmp_path).ctx(base_url=False)).summary["driver_url"]
    assert url == f"https://us.download.nvidia.com/tesla/{V}/NVIDIA-Linux-aarch64-{V}.run"


def test_arm64_without_prebuilt_modules_for_the_version_is_refused_not_compiled(tmp_path):
    arm = ArmCos(tmp_path, prebuilt=False)
    err = refusal(arm.ctx())
    base = f"file://{arm.bucket.root}/{COS_BUILD_ID}/lakitu-arm64"
    assert err.message == (
        f"COS build {COS_BUILD_ID} on aarch64: it publishes no prebuilt modules for driver "
        f"{V} ({base}/nvidia-drivers-{V}.tgz not found), and {boards.NOT_ON_ARM}")
    assert "default or latest" in (err.hint or "")
    assert not arm.tools_dir.exists()  # nothing prepared for a compile


def test_arm64_with_proprietary_modules_requested_is_refused(tmp_path):
    """The prebuilt modules are open; the proprietary ones would need a compile (or the
    x86_64-only precompiled .run)."""
    err = refusal(ArmCos(tmp_path).ctx(kernel_module_type="proprietary"))
    assert "--kernel-module-type proprietary" in err.message
    assert boards.NOT_ON_ARM in err.message


def test_arm64_never_probes_the_precompiled_run(tmp_path, monkeypatch):
    """Signatures enforced and no prebuilt modules: x86_64 would look for Google's
    x86_64 -custom.run; aarch64 asks for nothing under extensions/gpu/."""
    asked: list[str] = []
    real = Artifacts.exists
    monkeypatch.setattr(Artifacts, "exists", lambda self, name: asked.append(name)
                        or real(self, name))
    arm = ArmCos(tmp_path, prebuilt=False)
    arm.kernel.set_sig_enforce(True)
    refusal(arm.ctx())
    assert asked == [f"nvidia-drivers-{V}.tgz"]


def test_preload_on_arm64_is_refused(tmp_path):
    err = refusal(ArmCos(tmp_path).ctx(preload=True))
    assert err.message.startswith("--preload caches the COS toolchain and headers")


@pytest.mark.parametrize("machine, board, what", [
    ("aarch64", "lakitu", "this node is aarch64 but its COS board 'lakitu' is built for x86_64"),
    ("x86_64", "lakitu-arm64",
     "this node is x86_64 but its COS board 'lakitu-arm64' is built for aarch64"),
    # No board, and a template naming {board} (the default on aarch64): artifacts_base refuses.
    ("aarch64", None, "the COS artifacts URL needs {board}, but the host's /etc/lsb-release "
     "has no CHROMEOS_RELEASE_BOARD"),
])
def test_a_board_of_the_other_architecture_is_refused(tmp_path, machine, board, what):
    lsb = COS_113_LSB_RELEASE if board == "lakitu" else ARM_LSB_RELEASE
    if board is None:
        lsb = "".join(ln + "\n" for ln in lsb.splitlines()
                      if not ln.startswith("CHROMEOS_RELEASE_BOARD="))
    err = refusal(ArmCos(tmp_path, machine=machine, lsb_release=lsb).ctx())
    assert err.message.startswith(what)


def test_the_default_artifacts_url_on_an_arm64_node_is_the_boards_directory(tmp_path):
    """No --cos-artifacts-url: v2's cos-tools/<BUILD_ID>/<board> (nothing fetched here)."""
    arm = ArmCos(tmp_path)
    s = validate(Settings(host_root=arm.node.root, install_dir=arm.node.install_dir))
    kernel = KernelState(arm.kernel.proc_dir, arm.kernel.sys_dir, arm.kernel.dev_dir)
    assert CosFlow()._base(context(s, kernel)) == (
        f"https://storage.googleapis.com/cos-tools/{COS_BUILD_ID}/lakitu-arm64")

"""`install --dry-run` on a COS arm64 node, run as the pod runs it (issue 42's "done
means" on COS): a GB200 (0x2941) on the PCI bus with an NVLink5 bridge, a kernel saying
``aarch64`` (/proc/sys/kernel/arch), /etc/lsb-release naming the board ``lakitu-arm64``,
and the local HTTPS artifact server (127.0.0.1) serving that build's artifacts where
Google's cos-gpu-installer v2 reads them: ``cos-tools/<BUILD_ID>/lakitu-arm64/``
(cos/tools src/pkg/cos/artifacts.go NewGCSDownloader; installer/distros/cos/boards.py).
On today's main this run is refused (exit 3, "COS on aarch64 is not supported")."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.cosbucket import ARM_ALIASES, ARM_BOARD, ARM_LSB_RELEASE, Bucket, env_recording_run
from tests.cosbucket import ARM_V as V
from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import COS_BUILD_ID, COS_KERNEL, build_cos_node, tree_digest
from tests.fixtures.server import ArtifactServer
from tests.pod import last_event, ok, pod_on

pytestmark = pytest.mark.chroot

GB200 = "0x2941"
CDMM = "NVreg_CoherentGPUMemoryMode=driver"

ARM_BUILD = f"/cos-tools/{COS_BUILD_ID}/lakitu-arm64"


@pytest.fixture
def nvlink() -> bool:
    return True


@pytest.fixture
def arm_cos(tmp_path, nvlink):
    node = build_cos_node(tmp_path / "node", lsb_release=ARM_LSB_RELEASE)
    kernel = FakeKernel(tmp_path / "kernel", COS_KERNEL)
    kernel.set_machine("aarch64")
    kernel.add_gpu(device=GB200)
    if nvlink:
        kernel.add_nvlink5_bridge()
    bucket = Bucket(tmp_path / "bucket", board=ARM_BOARD, aliases=dict(ARM_ALIASES),
                    prebuilt_versions=(V,))
    bucket.write()
    with ArtifactServer() as server:
        pod = pod_on(node, kernel, server, tmp_path / "pod",
                     env={"COS_DOWNLOAD_GCS": bucket.serve(server)})
        yield node, kernel, server, pod


def test_dry_run_plans_googles_arm64_artifacts_the_sbsa_fabric_manager_and_cdmm(arm_cos):
    node, kernel, server, pod = arm_cos
    before = tree_digest(node.root)
    proc = ok(pod.run("install", "--dry-run", "-o", "json"))
    doc = json.loads(proc.stdout)
    base = f"{server.url}{ARM_BUILD}"
    assert doc["dry_run"] is True and doc["kind"] == "fresh"
    assert (doc["build_id"], doc["board"]) == (COS_BUILD_ID, "lakitu-arm64")
    assert doc["artifacts_url"] == base
    assert (doc["driver_version"], doc["version_source"]) == (V, f"{base}/gpu_default_version")
    assert doc["module_source"] == "prebuilt" and doc["kernel_module_type"] == "open"
    assert doc["prebuilt_modules_url"] == f"{base}/nvidia-drivers-{V}.tgz"
    assert doc["driver_url"] == f"{server.url}/tesla/{V}/NVIDIA-Linux-aarch64-{V}.run"
    steps = {s["name"]: s["detail"] for s in doc["steps"]}
    assert f"fabricmanager-linux-sbsa-{V}-archive " in steps["fabric_manager"]
    assert "unpack_prebuilt" in steps and "prepare_toolchain" not in steps
    assert doc["module_args"] == {"nvidia": [CDMM]}
    # Only the board's small metadata was read: the alias file and the prebuilt
    # modules' probe; nothing board-less (x86_64's), nothing under extensions/gpu/.
    assert sorted({(r.method, r.path) for r in server.requests}) == [
        ("GET", f"{ARM_BUILD}/gpu_default_version"),
        ("HEAD", f"{ARM_BUILD}/nvidia-drivers-{V}.tgz")]
    assert tree_digest(node.root) == before and kernel.calls() == []
    assert last_event(proc)["event"] == "install_finished"


def test_an_arm64_build_without_prebuilt_modules_for_the_version_exits_3(arm_cos):
    node, kernel, server, pod = arm_cos
    proc = pod.run("install", "--dry-run", env={"NVIDIA_DRIVER_VERSION": "580.95.05"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    final = last_event(proc)
    assert final["event"] == "install_failed" and "Traceback" not in proc.stderr
    assert final["message"].startswith(
        f"FAILED (unsupported_host, exit 3): COS build {COS_BUILD_ID} on aarch64: it publishes "
        "no prebuilt modules for driver 580.95.05")
    assert not any("/toolchain" in r.path or "kernel-headers" in r.path
                   for r in server.requests)


@pytest.fixture(scope="session")
def aarch64_run(tmp_path_factory):
    """The fixture .run under the aarch64 name (its payload is scripts: any architecture)."""
    out = tmp_path_factory.mktemp("cos-arm-run")
    run = env_recording_run(out, V)
    return shutil.copyfile(run, out / f"NVIDIA-Linux-aarch64-{V}.run")


# No NVLink5 bridge: the fabric manager (planned above) is the NVSwitch tests' subject.
@pytest.mark.parametrize("nvlink", [False])
def test_install_loads_the_boards_signed_prebuilt_modules(arm_cos, aarch64_run):
    node, kernel, server, pod = arm_cos
    server.serve_run(V, aarch64_run)
    kernel.set_sig_enforce(True)  # signed modules: loadable where unsigned ones are not
    final = last_event(ok(pod.run("install")))
    assert final["plan"] == "fresh" and final["driver_version"] == V
    cache = (node.install_dir / ".cache").read_text()
    assert "CACHE_FLAVOR=prebuilt-open" in cache and f"CACHE_BUILD_ID={COS_BUILD_ID}" in cache
    assert kernel.loaded()["nvidia"].version == V
    first = kernel.calls("insmod")[0]["argv"]  # CDMM on Grace (detect.with_grace_defaults)
    assert first[0].endswith("/nvidia.ko") and first[1:] == [CDMM]
    gets = [r.path for r in server.requests if r.method == "GET"]
    assert f"/tesla/{V}/NVIDIA-Linux-aarch64-{V}.run" in gets
    assert f"{ARM_BUILD}/nvidia-drivers-{V}.tgz" in gets
    assert not any("toolchain" in p or "kernel-headers" in p for p in gets)

"""Our images in GKE's own DaemonSets (issue 12, part 2), run as today's chroot pod.

The COS pod is shaped as container-engine-accelerators
nvidia-driver-installer/cos/daemonset-preloaded-latest.yaml (L86-123): its env names,
its mounts (install dir, Vulkan ICD dir, cos-tools at /build/cos-tools), and its
`bash -c` script that skips when lsmod shows nvidia and otherwise runs
`/cos-gpu-installer install --version=latest`. The Ubuntu pod is shaped as
nvidia-driver-installer/ubuntu/daemonset-preloaded-R535.yaml (L35-73): no install-dir
mount, /boot mounted, only NVIDIA_DRIVER_VERSION set, the image's own entrypoint.
Test seams only: the fake kernel, and the local HTTPS server for the .run and artifacts.
"""

# ruff: noqa: F811  (test_cos_install's fixtures, imported, are used as arguments)
from __future__ import annotations

import shlex
import shutil

import pytest

from tests.cosbucket import LATEST_V, custom_run
from tests.fixtures.node import COS_BUILD_ID, COS_KERNEL
from tests.integration.test_cos_install import (  # noqa: F401  (pytest fixtures)
    bucket,
    cos_runs,
    node,
    server,
)
from tests.pod import PYTHON, Pod, events

pytestmark = pytest.mark.chroot

ICD_HOST = "home/kubernetes/bin/nvidia/vulkan/icd.d"
GKE_COS_ENV = {
    "NVIDIA_INSTALL_DIR_HOST": "/home/kubernetes/bin/nvidia",
    "NVIDIA_INSTALL_DIR_CONTAINER": "/usr/local/nvidia",
    "VULKAN_ICD_DIR_HOST": f"/{ICD_HOST}",
    "VULKAN_ICD_DIR_CONTAINER": "/etc/vulkan/icd.d",
    "ROOT_MOUNT_DIR": "/root",
    "COS_TOOLS_DIR_HOST": "/var/lib/cos-tools",
    "COS_TOOLS_DIR_CONTAINER": "/build/cos-tools",
}
# daemonset-preloaded-latest.yaml L115-123, in our words but the same commands.
GKE_COS_SCRIPT = """\
echo "Checking for existing GPU driver modules"
if lsmod | grep nvidia; then
  echo "GPU driver is already installed, skipping installation"
  exit 0
fi
echo "No GPU driver module detected, installing now"
/cos-gpu-installer install --version=latest || exit 1
chmod 755 /root/home/kubernetes/bin/nvidia
"""
# The image's /cos-gpu-installer (images/cos/Dockerfile links the console script).
ENTRY = (f"#!/bin/sh\nexec {shlex.quote(PYTHON)} -c "
         "'from installer.gke.cos_gpu_installer_cli import main; main()' \"$@\"\n")


class GkeCosPod(Pod):
    """The pod with GKE's extra mounts and /cos-gpu-installer, running `bash -c SCRIPT`."""

    bucket = None  # written and served at the first run, so a test can change it first
    server = None

    def run_script(self, script: str, **kw):
        if self.bucket is not None:
            self.bucket.write()
            self.env["COS_DOWNLOAD_GCS"] = self.bucket.serve(self.server)
            self.bucket = None
        self.cli = ["bash", "-c", script]
        return self.run(**kw)

    def _script(self, cli, env, tmpfs_size=None, export=None, busy=()):
        lines = super()._script(getattr(self, "cli", cli), env, tmpfs_size, export,
                                busy).split("\n")
        rootfs, node = self.scratch / "rootfs", self.node_root
        extra = [
            f"mkdir -p {node}/{ICD_HOST} {node}/var/lib/cos-tools "
            f"{rootfs}/etc/vulkan/icd.d {rootfs}/build/cos-tools",
            f"mount --bind {node}/{ICD_HOST} {rootfs}/etc/vulkan/icd.d",
            f"mount --bind {node}/var/lib/cos-tools {rootfs}/build/cos-tools",
            f"cat > {rootfs}/cos-gpu-installer <<'ENTRY'\n{ENTRY}ENTRY",
            f"chmod 755 {rootfs}/cos-gpu-installer",
        ]
        at = next(i for i, line in enumerate(lines) if "pivot_root" in line)
        return "\n".join(lines[:at] + extra + lines[at:])


@pytest.fixture
def gke_pod(node, kernel, server, bucket, tmp_path):
    pod = GkeCosPod(
        node_root=node.root, install_dir=node.install_dir, scratch=tmp_path / "pod",
        fakebin=kernel.bin_dir, shared=[kernel.root],
        env={**GKE_COS_ENV, **kernel.env(),
             "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla",
             "REQUESTS_CA_BUNDLE": str(server.ca_bundle_path)})
    pod.bucket, pod.server = bucket, server
    return pod


def _last(proc) -> dict:
    return [e for e in events(proc.stderr) if "event" in e][-1]


def test_gke_cos_daemonset_installs_latest_then_skips_then_hits_the_cache(
        gke_pod, node, kernel):
    proc = gke_pod.run_script(GKE_COS_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "No GPU driver module detected" in proc.stdout
    final = _last(proc)
    assert final["event"] == "install_finished" and final["plan"] == "fresh"
    assert final["driver_version"] == LATEST_V
    assert kernel.loaded()["nvidia"].version == LATEST_V

    # COS_TOOLS_DIR_*: the toolchain cache is in the host's /var/lib/cos-tools.
    assert (node.root / "var/lib/cos-tools" / COS_BUILD_ID / "toolchain/bin").is_dir()
    # VULKAN_ICD_DIR_*: NVIDIA's ICD file landed in the host's ICD dir.
    icd = node.root / ICD_HOST / "nvidia_icd.json"
    assert '"library_path": "libGLX_nvidia.so.0"' in icd.read_text()
    # The .cache carries v2's keys too.
    record = (node.install_dir / ".cache").read_text()
    assert f"BUILD_ID={COS_BUILD_ID}\n" in record and f"DRIVER_VERSION={LATEST_V}\n" in record

    # A restarted pod with the modules loaded: GKE's script skips.
    proc = gke_pod.run_script(GKE_COS_SCRIPT)
    assert proc.returncode == 0 and "already installed" in proc.stdout

    # After a reboot: a cache hit.
    kernel.unload_all()
    proc = gke_pod.run_script(GKE_COS_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last(proc)["plan"] == "cached"


def test_a_v2_written_cache_is_a_hit(gke_pod, node, kernel):
    proc = gke_pod.run_script("/cos-gpu-installer install -version=latest")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # What cos-gpu-installer v2 leaves (cache.go L47-58: unordered KEY=VALUE lines).
    (node.install_dir / ".cache").write_text(
        f"DRIVER_VERSION={LATEST_V}\nBUILD_ID={COS_BUILD_ID}\n")
    kernel.unload_all()
    proc = gke_pod.run_script("/cos-gpu-installer install --version latest")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last(proc)["plan"] == "cached"
    assert kernel.loaded()["nvidia"].version == LATEST_V


# daemonset-confidential.yaml: the driver put in place with --no-verify, then loaded by
# the script itself (the same commands; insmod/modprobe through PATH, where the pod has
# the fake kernel's kmod, instead of /sbin).
GKE_CONFIDENTIAL_SCRIPT = """\
if lsmod | grep nvidia; then
  echo "GPU driver is already installed, skipping installation"
  exit 0
fi
/cos-gpu-installer install --no-verify --version=default || exit 1
echo "LOADING"
modprobe -d /root drm_kms_helper; insmod /usr/local/nvidia/drivers/nvidia.ko; \
insmod /usr/local/nvidia/drivers/nvidia-uvm.ko; insmod /usr/local/nvidia/drivers/nvidia-modeset.ko; \
insmod /usr/local/nvidia/drivers/nvidia-drm.ko
/usr/local/nvidia/bin/nvidia-modprobe -c0 -u -m
chmod 755 /root/home/kubernetes/bin/nvidia
"""


def test_gke_confidential_daemonset_installs_with_no_verify_and_loads_itself(
        gke_pod, node, kernel):
    proc = gke_pod.run_script(GKE_CONFIDENTIAL_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = _last(proc)
    assert final["event"] == "install_finished" and final["plan"] == "fresh"
    assert "--install-only: nothing loaded or verified" in final["message"]
    # Our run loaded nothing and ran no nvidia-smi: every insmod is the script's own.
    installer_steps = {e.get("step") for e in events(proc.stderr)}
    assert {"load_modules", "device_nodes", "verify"}.isdisjoint(installer_steps)
    assert not kernel.calls("nvidia-smi")
    assert (node.install_dir / ".cache").is_file()
    assert "nvidia" in kernel.loaded()  # loaded by the script from what we installed
    assert not (node.root / "run/nvidia/validations/driver-ready").exists()

    # A later plain run (the pod restarted after a reboot) is a cache hit that loads.
    kernel.unload_all()
    proc = gke_pod.run_script("/cos-gpu-installer install --version=default")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last(proc)["plan"] == "cached" and "nvidia" in kernel.loaded()


def test_gke_ubuntu_daemonset_shape(tmp_path):
    from tests.pod import ubuntu_pod

    with ubuntu_pod(tmp_path, version="535.183.01") as (node, kernel, server, pod):
        pod.mount_install_dir = False  # GKE's Ubuntu DaemonSet mounts only /, /dev, /boot
        proc = pod.run("install")  # the image's entrypoint (CMD install)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert _last(proc)["plan"] == "fresh"
        assert (node.root / "home/kubernetes/bin/nvidia/drivers/nvidia.ko").exists()
        assert "BUILD_ID=" not in (node.install_dir / ".cache").read_text()


def test_v2_prepared_build_tools_are_reused(gke_pod, node, kernel, server):
    ok = gke_pod.run_script("/cos-gpu-installer install -version=latest")
    assert ok.returncode == 0, ok.stderr[-3000:]
    # Re-shape the tools cache as v2's -prepare-build-tools leaves it: the toolchain and
    # kernel-headers.tgz extracted at the top of /var/lib/cos-tools, nothing per build.
    tools = node.root / "var/lib/cos-tools"
    ours = tools / COS_BUILD_ID
    for part in ("toolchain", "kernel-headers"):
        for child in (ours / part).iterdir():
            if not child.name.startswith("."):
                shutil.copytree(child, tools / child.name, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(ours)
    kernel.unload_all()
    before = len(server.requests)
    proc = gke_pod.run_script("/cos-gpu-installer install -version=latest",
                              env={"FORCE_REINSTALL": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last(proc)["plan"] == "fresh"
    fetched = [r.path for r in server.requests[before:]]
    assert not [p for p in fetched if p.endswith(("kernel-headers.tgz", "toolchain.tar.xz"))]
    assert not ours.exists()  # built from v2's tree, nothing re-downloaded into ours


def test_precompiled_for_any_branch_when_no_prebuilt_modules(gke_pod, node, kernel, bucket,
                                                            tmp_path):
    # v2 (install.go L296-318): no prebuilt modules -> the precompiled .run, whatever the
    # branch. R570 on an L4 would build the open modules by default; signed, only the
    # precompiled proprietary ones load.
    version = "570.133.20"
    kernel.set_sig_enforce(True)
    bucket.custom_runs = {version: custom_run(tmp_path / "custom", version, COS_KERNEL)}
    bucket.signature_versions = (version,)
    proc = gke_pod.run_script(f"/cos-gpu-installer install --version={version}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CACHE_FLAVOR=precompiled-signed" in (node.install_dir / ".cache").read_text()
    assert kernel.loaded()["nvidia"].version == version


# What the kubelet puts in every container's env (kubelet_pods.go, getServiceEnvVarMap:
# the "kubernetes" service of the default namespace); GKE's DaemonSets set no WHEN_IN_USE.
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_gke_ubuntu_daemonset_stages_a_new_version_on_a_busy_node(tmp_path):
    """Issue 34 §1: a version change in GKE's own Ubuntu DaemonSet (only
    NVIDIA_DRIVER_VERSION in its env) on a node whose GPU is in use: the init container exits
    0 with the new driver staged and the old one kept, not exit 8 and CrashLoopBackOff. The
    same run by hand (no KUBERNETES_SERVICE_HOST) keeps the documented default, fail."""
    from tests.fixtures.runfile import build_driver_run
    from tests.pod import ubuntu_pod

    old, new = "580.82.07", "580.95.05"
    with ubuntu_pod(tmp_path, version=old, env=KUBELET_ENV) as (node, kernel, server, pod):
        server.serve_run(new, build_driver_run(tmp_path / "runs-new", new))
        pod.mount_install_dir = False  # GKE's Ubuntu DaemonSet mounts only /, /dev, /boot
        assert pod.run("install").returncode == 0
        kernel.hold("nvidia")  # a workload has the GPU open

        by_hand = pod.run("install", env={"NVIDIA_DRIVER_VERSION": new,
                                          "KUBERNETES_SERVICE_HOST": ""})
        assert by_hand.returncode == 8, by_hand.stderr[-2000:]
        assert "nvidia: 1 reference(s)" in _last(by_hand)["message"]

        proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": new})
        assert proc.returncode == 0, proc.stderr[-3000:]
        final = _last(proc)
        assert final["plan"] == "staged", final
        assert final["message"].startswith(f"NVIDIA driver {old} keeps running")
        assert kernel.loaded()["nvidia"].version == old
        assert f"CACHE_NVIDIA_DRIVER_VERSION={new}" in (
            node.install_dir / ".next-boot/.cache").read_text()

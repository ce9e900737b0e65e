"""Our images in GKE's own DaemonSets, under podman + runc (issue 12, part 2).

The pods are GKE's DaemonSets as test data (tests/pod_tier/gke/: their commands,
env names, volumes and mounts) with only their image names mapped to our images
and the test seams added, played on fixture nodes as tests/pod_tier/test_pod.py
plays ours. The COS one runs GKE's `bash -c` script (skip if `lsmod` shows
nvidia, else `/cos-gpu-installer install --version=latest`); the Ubuntu one runs
our image's own entrypoint with no env at all.
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from installer.distros.ubuntu import Ubuntu
from tests.fixtures.node import COS_BUILD_ID
from tests.fixtures.runfile import build_driver_run
from tests.fixtures.server import ArtifactServer
from tests.pod_tier.checks import assert_ran, cos_node, pod_name, ubuntu_node
from tests.pod_tier.workload import PAUSE, FixtureNode, Kubelet, gke_daemonset, role_images

pytestmark = [
    pytest.mark.skipif(os.environ.get("NDI_POD_TESTS") != "1",
                       reason="pod tier: run `make test-pod` (sets NDI_POD_TESTS=1)"),
    pytest.mark.timeout(900),
]

ICD_HOST = "/home/kubernetes/bin/nvidia/vulkan/icd.d"  # GKE's VULKAN_ICD_DIR_HOST
# Big downloads: the .run (NVIDIA's or the -custom one), toolchain.tar.xz, *.tgz.
BIG = (".run", ".tar.xz", ".tgz", ".tar.gz")


def gke_kubelet(podman, built, flavor: str) -> tuple[Kubelet, dict]:
    ds = gke_daemonset(flavor)
    return Kubelet(podman, role_images(ds, built[flavor], built[PAUSE])), ds


def make_host_paths(node: FixtureNode, ds: dict) -> None:
    """A hostPath of no type must exist for podman's `kube play` (containerd creates it)."""
    for vol in ds["spec"]["template"]["spec"]["volumes"]:
        if vol["hostPath"]["path"] != "/dev":
            node.node.path(vol["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def gke_cos(podman, built, tmp_path_factory):
    """A COS node after GKE's COS DaemonSet ran our image: (node, pod, kubelet, ds)."""
    from tests.cosbucket import LATEST_V

    kubelet, ds = gke_kubelet(podman, built, "cos")
    with ArtifactServer() as server:
        node = cos_node(tmp_path_factory.mktemp("gke-cos"), server, LATEST_V)
        make_host_paths(node, ds)
        try:
            yield node, kubelet.run(node, pod_name("gke-cos"), ds), kubelet, ds
        finally:
            kubelet.close()


def test_gke_cos_daemonset_installs_with_our_image(gke_cos):
    from tests.cosbucket import LATEST_V

    node, pod, _, _ = gke_cos
    assert_ran(node, pod, LATEST_V, "fresh")
    assert "No GPU driver module detected, installing now" in pod.logs  # GKE's script ran
    assert node.kernel.loaded()["nvidia"].version == LATEST_V
    # VULKAN_ICD_DIR_*: NVIDIA's ICD file is on the host, in GKE's ICD dir.
    icd = json.loads(node.node.path(f"{ICD_HOST}/nvidia_icd.json").read_text())
    assert icd["ICD"]["library_path"] == "libGLX_nvidia.so.0"
    # COS_TOOLS_DIR_*: the toolchain is cached in the host's /var/lib/cos-tools.
    assert node.node.path(f"/var/lib/cos-tools/{COS_BUILD_ID}/toolchain/bin").is_dir()
    # v2's keys are in our record, and the script's last command ran.
    record = (node.node.install_dir / ".cache").read_text()
    assert f"BUILD_ID={COS_BUILD_ID}\n" in record and f"DRIVER_VERSION={LATEST_V}\n" in record
    assert node.node.install_dir.stat().st_mode & 0o777 == 0o755


def test_a_cache_written_by_cos_gpu_installer_v2_is_a_hit(gke_cos):
    """After a reboot, a node whose .cache cos-gpu-installer v2 wrote (cache.go L47-58:
    its KEY=VALUE lines in map order, nothing else) loads the installed driver: no
    download, no build."""
    from tests.cosbucket import LATEST_V

    node, first, kubelet, ds = gke_cos
    kubelet.remove(first.name)
    cache = node.node.install_dir / ".cache"
    # Proprietary modules: v2 writes no KERNEL_OPEN=Y (it does only for open ones).
    assert "CACHE_FLAVOR=compiled-proprietary\n" in cache.read_text()
    cache.write_text(f"DRIVER_VERSION={LATEST_V}\nBUILD_ID={COS_BUILD_ID}\n")
    ko = node.node.install_dir / "drivers/nvidia.ko"
    built = ko.stat().st_mtime_ns
    node.kernel.unload_all()
    before = len(node.server.requests)

    second = kubelet.run(node, pod_name("gke-cos-v2-cache"), ds)

    assert_ran(node, second, LATEST_V, "cached")
    assert "loaded from the cache" in json.loads(second.last_line)["message"]
    fetched = [r.path for r in node.server.requests[before:]]
    assert not [p for p in fetched if p.endswith(BIG)], fetched
    assert ko.stat().st_mtime_ns == built, "the module was rebuilt"


def test_gke_ubuntu_daemonset_installs_with_our_image(podman, built, tmp_path):
    kubelet, ds = gke_kubelet(podman, built, "ubuntu")
    version = Ubuntu.default_version  # GKE's Ubuntu DaemonSet sets no NVIDIA_DRIVER_VERSION
    try:
        with ArtifactServer() as server:
            node, run_path = ubuntu_node(tmp_path, server, version=version)
            make_host_paths(node, ds)
            pod = kubelet.run(node, pod_name("gke-ubuntu"), ds)
        assert_ran(node, pod, version, "fresh")
        assert [r.status for r in node.server.requests_for(run_path)] == [200]
        assert f"CACHE_KERNEL_VERSION={node.kernel.release}\n" in \
            (node.node.install_dir / ".cache").read_text()
    finally:
        kubelet.close()


# What the kubelet puts in every container's env and podman does not (kubelet_pods.go,
# getServiceEnvVarMap: the default namespace's "kubernetes" service).
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_gke_ubuntu_daemonset_stages_a_new_version_on_a_busy_node(podman, built, tmp_path):
    """Issue 34 §1: GKE's Ubuntu DaemonSet (no WHEN_IN_USE; the version as its -R5xx
    variants set it) with our image, on a node whose GPU is in use when the version changes:
    the init container exits 0, the pause container runs, the old driver stays loaded and
    the new one waits in .next-boot. Not exit 8 and CrashLoopBackOff."""
    kubelet, ds = gke_kubelet(podman, built, "ubuntu")
    old, new = Ubuntu.default_version, "580.95.05"
    with_new = copy.deepcopy(ds)
    (init,) = with_new["spec"]["template"]["spec"]["initContainers"]
    init["env"] = [{"name": "NVIDIA_DRIVER_VERSION", "value": new}]
    try:
        with ArtifactServer() as server:
            node, _ = ubuntu_node(tmp_path, server, version=old)
            node.env.update(KUBELET_ENV)
            run = build_driver_run(tmp_path / "runs-new", new)
            server.serve(f"/tesla/{new}/{run.name}", run)
            make_host_paths(node, ds)
            assert_ran(node, kubelet.run(node, pod_name("gke-ubuntu-old"), ds), old, "fresh")
            node.kernel.hold("nvidia")  # a workload has the GPU open
            pod = kubelet.run(node, pod_name("gke-ubuntu-new"), with_new)
        assert (pod.init["State"]["Status"], pod.init["State"]["ExitCode"]) == ("exited", 0), \
            pod.logs[-3000:]
        assert pod.pause["State"]["Status"] == "running"
        final = json.loads(pod.last_line)
        assert (final["outcome"], final["plan"]) == ("ok", "staged"), final
        assert node.kernel.loaded()["nvidia"].version == old
        assert f"CACHE_NVIDIA_DRIVER_VERSION={new}" in \
            (node.node.install_dir / ".next-boot/.cache").read_text()
    finally:
        kubelet.close()

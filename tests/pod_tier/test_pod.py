"""The committed DaemonSets' pods under a real container runtime (podman + runc).

`make test-pod` (NDI_POD_TESTS=1; root). Each test plays the committed
manifest's pod template as a Pod (tests/pod_tier/podspec.py says what changes)
with our images, built by images/build.sh into podman's storage, on a fixture
node. podman, not a chroot, gives the containers their rootfs, /dev, /proc,
/sys, cgroups, privileges and the manifest's hostPath mounts: a kubelet's
view. The images have an empty /dev, as registry images do.

Faked is what CI cannot have (tests/fixtures/README.md): the kernel, NVIDIA's
download host and the cos-tools bucket (a local HTTPS server), apt.
"""

from __future__ import annotations

import json
import os

import pytest

from installer.commands.manifests import values
from tests.fixtures.node import COS_BUILD_ID
from tests.fixtures.server import ArtifactServer
from tests.pod_tier.checks import assert_installed, cos_node, manifest_env, pod_name, ubuntu_node
from tests.pod_tier.lifecycle import FAILED
from tests.pod_tier.workload import Kubelet

pytestmark = [
    pytest.mark.skipif(os.environ.get("NDI_POD_TESTS") != "1",
                       reason="pod tier: run `make test-pod` (sets NDI_POD_TESTS=1)"),
    pytest.mark.timeout(900),
]

# --- the images ----------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", values.IMAGE_FLAVORS)
def test_image_rootfs_has_an_empty_dev(podman, images, flavor):
    """As registry images: the pod's /dev comes from the runtime and the hostPath mount."""
    (image,) = [v for k, v in images[flavor].items() if "nvidia-driver-installer" in k]
    assert podman.image_rootfs_listing(image, "/dev") == []


def test_cos_image_has_gnu_ld_for_the_legacy_link(podman, built):
    """COS precompiled modules the kernel refuses are relinked with GNU ld (distros/cos/
    precompiled.py load_or_relink, as cos-gpu-installer v2), which the image brings."""
    assert {"ld", "ld.bfd"} <= set(podman.image_rootfs_listing(built["cos"], "/usr/bin"))


# --- Ubuntu: a fresh install, then a reboot --------------------------------------------------


@pytest.fixture(scope="module")
def ubuntu_installed(podman, images, tmp_path_factory):
    """An Ubuntu node after the DaemonSet's first pod; (node, pod, .run path, kubelet)."""
    kubelet = Kubelet(podman, images["ubuntu"])
    with ArtifactServer() as server:
        node, run_path = ubuntu_node(tmp_path_factory.mktemp("ubuntu"), server)
        try:
            yield node, kubelet.run(node, pod_name("ubuntu")), run_path, kubelet
        finally:
            kubelet.close()


def test_ubuntu_fresh_install(ubuntu_installed):
    node, pod, run_path, _ = ubuntu_installed
    version = manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    assert_installed(node, pod, version, "fresh")
    assert [r.status for r in node.server.requests_for(run_path)] == [200]
    # The host's headers were used (no apt: the fake apt-get logs every call).
    assert "apt-get" not in node.kernel.call_log.read_text()


def test_ubuntu_reboot_is_a_cache_hit(ubuntu_installed):
    node, first, run_path, kubelet = ubuntu_installed
    version = manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    ko = node.node.install_dir / "drivers/nvidia.ko"
    built = ko.stat().st_mtime_ns
    kubelet.remove(first.name)
    node.kernel.unload_all()  # the reboot: no modules, no device nodes
    assert not node.kernel.loaded()

    second = kubelet.run(node, pod_name("ubuntu-reboot"))

    assert_installed(node, second, version, "cached")
    assert "loaded from the cache" in json.loads(second.last_line)["message"]
    assert len(node.server.requests_for(run_path)) == 1, "the .run was downloaded again"
    assert ko.stat().st_mtime_ns == built, "the module was rebuilt"


# --- COS -------------------------------------------------------------------------------------


def test_cos_fresh_install(kubelet, tmp_path):
    from tests.cosbucket import DEFAULT_V

    assert manifest_env("cos")["NVIDIA_DRIVER_VERSION"] == "default"  # resolves to DEFAULT_V
    with ArtifactServer() as server:
        node = cos_node(tmp_path, server, DEFAULT_V)
        pod = kubelet.run(node, pod_name("cos"))
    assert_installed(node, pod, DEFAULT_V, "fresh")
    assert f"CACHE_BUILD_ID={COS_BUILD_ID}\n" in (node.node.install_dir / ".cache").read_text()
    # The toolchain landed in the host's cache through the manifest's cos-tools hostPath.
    assert any(node.node.path("/var/lib/cos-tools").iterdir())


# --- a failed install ----------------------------------------------------------------------


@pytest.mark.parametrize("serve, code, error_class", [("none", 5, "download"),
                                                       ("corrupt", 6, "integrity")])
def test_failed_install_reaches_podman_and_pause_never_starts(kubelet, tmp_path, serve, code,
                                                              error_class):
    """The docs/contract.md §3 exit code in `podman inspect`, the error event as the last line of
    `podman logs` (what `kubectl logs` and FallbackToLogsOnError show), no pause."""
    with ArtifactServer() as server:
        node, run_path = ubuntu_node(tmp_path, server, serve=serve)
        pod = kubelet.run(node, pod_name(f"fail-{serve}"))
    assert (pod.phase, pod.failed) == (FAILED, "nvidia-driver-installer")
    assert (pod.init["State"]["Status"], pod.init["State"]["ExitCode"]) == ("exited", code)
    final = json.loads(pod.last_line)
    assert (final["event"], final["exit_code"], final["error_class"]) == \
        ("install_failed", code, error_class), final
    # The failing URL, or the downloaded file, is named.
    assert (final.get("url") or final["path"]).endswith(run_path.rsplit("/", 1)[1])
    assert pod.pause["State"]["Status"] == "created"
    assert pod.pause["State"]["StartedAt"].startswith("0001-01-01")
    install = node.node.install_dir
    assert not (install / ".cache").exists()
    status = json.loads((install / "status.json").read_text())
    assert (status["outcome"], status["error_class"]) == ("error", error_class)
    assert not node.kernel.loaded()

"""Fixtures of the pod tier (`make test-pod`): podman, our images in its storage, a kubelet.

Environment:
  NDI_POD_TESTS=1          run the tier (`make test-pod` sets it; the default run skips it)
  NDI_POD_REQUIRED=1       fail instead of skipping when podman & co. are missing (CI)
  NDI_POD_NO_BUILD=1       use the images already built with NDI_IMAGE_TAG (no images/build.sh)
"""

from __future__ import annotations

import os
import subprocess

import pytest

from installer.commands.manifests import values
from tests.pod_tier.podman import GRAPHROOT, RUNROOT, Podman, missing_tools
from tests.pod_tier.workload import PAUSE, REPO, Kubelet, committed_daemonset, role_images


def _unavailable(reason: str) -> None:
    if os.environ.get("NDI_POD_REQUIRED") == "1":
        pytest.fail(f"pod tier required (NDI_POD_REQUIRED=1) but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Podman:
    if os.geteuid() != 0:
        _unavailable("podman runs privileged pods here only as root")
    missing = missing_tools()
    if missing:
        _unavailable(f"missing {', '.join(missing)}: `make test-pod` installs them "
                     "(Makefile POD_DEPS)")
    pm = Podman.create(tmp_path_factory.mktemp("podman-conf"))
    assert pm("info", "--format", "{{.Host.OCIRuntime.Name}}").stdout.strip() == "runc"
    links = set(os.listdir("/sys/class/net"))
    yield pm
    # Host networking only: no bridge, veth or other link left behind.
    assert set(os.listdir("/sys/class/net")) <= links


@pytest.fixture(scope="session")
def built(podman) -> dict[str, str]:
    """{flavor: our image, PAUSE: a pause image}, built into podman's storage.

    A tag of this run's own (layers are cached, so this costs a commit): a
    concurrent `make images` of another checkout cannot swap the image under us.
    """
    tag = os.environ.get("NDI_IMAGE_TAG") or f"pod-{os.getpid()}"
    if os.environ.get("NDI_POD_NO_BUILD") != "1":
        proc = subprocess.run(
            ["bash", str(REPO / "images/build.sh")], capture_output=True, text=True, timeout=840,
            env={**podman.env(), "NDI_IMAGE_TAG": tag, "NDI_BUILDAH_ROOT": GRAPHROOT,
                 "NDI_BUILDAH_RUNROOT": RUNROOT, "NDI_LOCAL_BASE": "1",  # substitute base
                 # The pods run this machine's architecture: the arm64 images (qemu-user,
                 # minutes) are the image tier's (tests/test_multiarch.py).
                 "NDI_IMAGE_ARCHES": subprocess.run(
                     ["dpkg", "--print-architecture"], capture_output=True, text=True,
                     check=True, timeout=30).stdout.strip()})
        assert proc.returncode == 0, proc.stderr[-4000:]
    local = {flavor: f"localhost/nvidia-driver-installer-{flavor}:{tag}"
             for flavor in values.IMAGE_FLAVORS}
    yield {**local, PAUSE: podman.pause_image()}
    if not os.environ.get("NDI_IMAGE_TAG"):
        for name in local.values():  # only the names: the layers stay cached
            podman("untag", name, name, check=False)  # that name only, not all of the image's


@pytest.fixture(scope="session")
def images(built) -> dict[str, dict[str, str]]:
    """{flavor: {committed manifest's image: local image}}."""
    return {flavor: role_images(committed_daemonset(flavor),
                                built[values.DISTROS_BY_FLAVOR[flavor].image()], built[PAUSE])
            for flavor in values.FLAVORS}


@pytest.fixture
def kubelet(podman, images):
    k = Kubelet(podman, {k: v for mapping in images.values() for k, v in mapping.items()})
    yield k
    k.close()

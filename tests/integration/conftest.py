"""A fixture Ubuntu node, its kernel, an artifact server and the pod that installs on it."""

from __future__ import annotations

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import build_ubuntu_node
from tests.fixtures.runfile import build_driver_run
from tests.fixtures.server import ArtifactServer
from tests.pod import Pod

RELEASE = "5.15.0-1049-gke"
VERSIONS = ("550.54.14", "535.183.01")


@pytest.fixture(scope="session")
def driver_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {v: build_driver_run(out, v) for v in VERSIONS}


@pytest.fixture
def server(driver_runs):
    with ArtifactServer() as srv:
        for version, run in driver_runs.items():
            srv.serve(f"/tesla/{version}/{run.name}", run)
        yield srv


@pytest.fixture
def kernel(tmp_path):
    k = FakeKernel(tmp_path / "kernel", RELEASE)
    k.add_gpu()
    return k


@pytest.fixture
def node(tmp_path):
    return build_ubuntu_node(tmp_path / "node", kernel_release=RELEASE)


@pytest.fixture
def pod(node, kernel, server, tmp_path):
    return Pod(
        node_root=node.root,
        install_dir=node.install_dir,
        scratch=tmp_path / "pod",
        fakebin=kernel.bin_dir,
        shared=[kernel.root],
        env={
            **kernel.env(),
            "NVIDIA_DRIVER_VERSION": VERSIONS[0],
            "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla",
            "REQUESTS_CA_BUNDLE": str(server.ca_bundle_path),
        },
    )

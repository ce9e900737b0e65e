"""A fixture Ubuntu node, its kernel, an artifact server and the pod that installs on it.

The COS tests override node, server and pod with their COS counterparts."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import build_ubuntu_node
from tests.fixtures.runfile import build_driver_run
from tests.fixtures.server import ArtifactServer
from tests.pod import pod_on

V1, V2 = "550.54.14", "535.183.01"  # the version the tests install and the one they switch to


@pytest.fixture(scope="session")
def driver_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {v: build_driver_run(out, v) for v in (V1, V2)}


def serve_runs(runs: dict[str, Path]):
    """An artifact server with each .run at NVIDIA's /tesla/<V>/<name> layout."""
    with ArtifactServer() as srv:
        for version, run in runs.items():
            srv.serve_run(version, run)
        yield srv


@pytest.fixture
def server(driver_runs):
    yield from serve_runs(driver_runs)


@pytest.fixture
def kernel(node, tmp_path):
    k = FakeKernel(tmp_path / "kernel", node.kernel_release)
    k.add_gpu()  # an NVIDIA L4
    return k


@pytest.fixture
def node(tmp_path):
    return build_ubuntu_node(tmp_path / "node")


@pytest.fixture
def pod(node, kernel, server, tmp_path):
    return pod_on(node, kernel, server, tmp_path / "pod", env={"NVIDIA_DRIVER_VERSION": V1})


@pytest.fixture
def sidecars(pod):
    """``start(kind, **env)``: ``sidecar <kind>`` in the pod, as the DaemonSet's native
    sidecars run beside the install (issue 31); each is stopped (SIGTERM) at the end."""
    started = []

    def start(kind: str, **env: str) -> subprocess.Popen[str]:
        proc = pod.start("sidecar", kind, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)

"""A fixture Ubuntu node, its kernel, an artifact server and the pod that installs on it.

The COS tests override node, server and pod with their COS counterparts."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import build_ubuntu_node
from tests.fixtures.runfile import build_driver_run
from tests.fixtures.server import ArtifactServer
from tests.pod import Pod, ok, pod_on

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


def state_digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every entry under ``root`` but ``skip`` (paths relative to it), not following links:
    type, mode and content digest (a device node by its type and mode: it has no bytes)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel in skip:
                continue
            st = p.lstat()
            out[rel] = ("link:" + os.readlink(p) if stat.S_ISLNK(st.st_mode) else
                        f"{st.st_mode:o}:" + hashlib.sha256(p.read_bytes()).hexdigest()
                        if stat.S_ISREG(st.st_mode) else f"{st.st_mode:o}")
    return out


class ReadOnlyPod(Pod):
    """A pod on a node that several tests share: each run must leave the node and its kernel
    as it found them (the kernel's call log aside, which only grows), so that sharing one
    install between tests changes nothing any of them sees."""

    kernel_root: Path

    def run(self, *args, **kwargs):
        before = state_digest(self.node_root), self._kernel_state()
        proc = super().run(*args, **kwargs)
        after = state_digest(self.node_root), self._kernel_state()
        for was, now in zip(before, after, strict=True):
            changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
            assert not changed, f"{args} changed the shared node: {changed}"
        return proc

    def _kernel_state(self) -> dict[str, str]:
        return state_digest(self.kernel_root, skip=("calls.jsonl",))


@pytest.fixture(scope="module")
def installed_once(tmp_path_factory, driver_runs):
    """One fresh install of V1 on an Ubuntu node with an L4, shared by a module's tests that
    only read the installed node (verify): a ReadOnlyPod, so a run that changed the node
    fails its test. Yields (pod, the install's run)."""
    work = tmp_path_factory.mktemp("installed-once")
    node = build_ubuntu_node(work / "node")
    kernel = FakeKernel(work / "kernel", node.kernel_release)
    kernel.add_gpu()
    with contextlib.contextmanager(serve_runs)(driver_runs) as srv:
        pod = pod_on(node, kernel, srv, work / "pod", pod_class=ReadOnlyPod,
                     env={"NVIDIA_DRIVER_VERSION": V1})
        pod.kernel_root = kernel.root
        install = ok(Pod.run(pod, "install"))
        yield pod, install

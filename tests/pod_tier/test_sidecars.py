"""Issue 31: the daemon sidecars `manifests render --persistenced / --nvswitch` adds, run in
their pod under podman + runc the way a kubelet runs native sidecars (lifecycle.py).

The DaemonSets are rendered by the CLI, as a user renders them; the nodes are the tier's
Ubuntu fixture nodes, the NVSwitch one with the fixtures' NVSwitch pieces (FakeKernel.
add_nvswitch, tests/fixtures/fabricmanager.py: the fake fabric manager archive, a fake
nv-fabricmanager that completes the fake fabric only once it runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest
import yaml

from tests.fixtures import fabricmanager
from tests.fixtures.server import ArtifactServer
from tests.pod_tier.checks import assert_installed, manifest_env, pod_name, ubuntu_node
from tests.pod_tier.workload import INIT, PAUSE, REPO, Kubelet

pytestmark = [
    pytest.mark.skipif(os.environ.get("NDI_POD_TESTS") != "1",
                       reason="pod tier: run `make test-pod` (sets NDI_POD_TESTS=1)"),
    pytest.mark.timeout(900),
]

PERSISTENCED, FABRIC_MANAGER = "nvidia-persistenced", "nvidia-fabricmanager"


def rendered(*flags: str) -> dict:
    """`nvidia-driver-installer manifests render --flavor ubuntu FLAGS` (stdout)."""
    proc = subprocess.run([sys.executable, "-m", "installer", "manifests", "render",
                           "--flavor", "ubuntu", *flags], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def init_names(ds: dict) -> list[str]:
    return [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]]


def at(doc: dict, key: str = "StartedAt") -> datetime:
    """podman's StartedAt or FinishedAt (RFC 3339, nanoseconds, trailing zeros cut)."""
    day, frac, zone = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)",
                                   doc["State"][key]).groups()
    micros = (frac or "0")[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{day}.{micros}{zone.replace('Z', '+00:00')}")


def daemon_state(node, daemon: str) -> dict:
    return json.loads((node.node.install_dir / f"daemons/{daemon}.json").read_text())


def ready_fields(node) -> dict[str, str]:
    text = node.node.path("/run/nvidia/validations/driver-ready").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


@pytest.fixture
def kubelet(podman, images):
    k = Kubelet(podman, images["ubuntu"])  # the sidecars run the installer's image
    yield k
    k.close()


def test_persistenced_sidecar_is_up_and_the_install_is_ready_only_with_it(kubelet, tmp_path):
    ds = rendered("--persistenced")
    assert init_names(ds) == [PERSISTENCED, INIT]
    version = manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    with ArtifactServer() as server:  # up while the pod runs: its CA is mounted in it
        node, _ = ubuntu_node(tmp_path, server)
        pod = kubelet.run(node, pod_name("persistenced"), ds)
        assert_installed(node, pod, version, "fresh")
        sidecar = pod.sidecars[PERSISTENCED]
        assert sidecar["State"]["Status"] == "running", kubelet.logs(pod.name, PERSISTENCED)
        # The kubelet's order: the sidecar started, then the install; the install waited for it.
        assert at(sidecar) < at(pod.init) < at(pod.pause)
        assert daemon_state(node, "persistenced")["state"] == "running"
        assert ready_fields(node)["DAEMONS"] == "persistenced"
        # NVIDIA's daemon (Debian's build, in the fixture .run) ran: its syslog relayed.
        assert any(e.get("event") == "daemon_syslog" and e["message"].startswith("Started (")
                   for e in syslog_events(kubelet.logs(pod.name, PERSISTENCED)))

        # Restarted when it dies, as a kubelet restarts a sidecar (after its 10 s backoff).
        kubelet.podman("kill", f"{pod.name}-{PERSISTENCED}")
        deadline = time.monotonic() + 60
        while kubelet.pods[pod.name].restarts[PERSISTENCED] == 0:
            assert time.monotonic() < deadline, kubelet.pods[pod.name].start_errors
            time.sleep(1)
        assert kubelet.podman.inspect(f"{pod.name}-{PERSISTENCED}")["State"]["Status"] == "running"

        # Stopped after the main container when the pod goes.
        kubelet.pods[pod.name].terminate(grace_s=5)
        pause, sidecar = (kubelet.podman.inspect(f"{pod.name}-{c}") for c in (PAUSE, PERSISTENCED))
        assert pause["State"]["Status"] == sidecar["State"]["Status"] == "exited"
        assert at(pause, "FinishedAt") <= at(sidecar, "FinishedAt")


def test_a_persistenced_that_dies_is_the_pods_concern(kubelet, tmp_path):
    """NVIDIA's daemon forks away from the sidecar; killed, the sidecar exits 9 with one line
    naming it, and the kubelet restarts the sidecar, which starts a new daemon (over the
    dead one's pid file: the container's filesystem survives a restart)."""
    ds = rendered("--persistenced")
    version = manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    # The server stays up while the pod runs: its CA dir is mounted in every container, so a
    # restarted sidecar cannot start once it is gone (runc: the mount source is missing).
    with ArtifactServer() as server:
        node, _ = ubuntu_node(tmp_path, server)
        pod = kubelet.run(node, pod_name("persistenced-dies"), ds)
        assert_installed(node, pod, version, "fresh")
        container = f"{pod.name}-{PERSISTENCED}"
        first = daemon_state(node, "persistenced")
        assert first["state"] == "running", first
        pid = first["detail"].split()[1]
        kubelet.podman("exec", container, "sh", "-c", f"kill -KILL {pid}")  # sh's own kill
        deadline = time.monotonic() + 90
        while kubelet.pods[pod.name].restarts[PERSISTENCED] == 0:
            assert time.monotonic() < deadline, (kubelet.pods[pod.name].start_errors,
                                                 kubelet.logs(pod.name, PERSISTENCED)[-3000:])
            time.sleep(1)
        said = [e for e in syslog_events(kubelet.logs(pod.name, PERSISTENCED)) if "error" in e]
        assert said and said[0]["error"].startswith(
            f"persistenced (pid {pid}) exited with signal SIGKILL: "), said
        # The restarted sidecar starts a new daemon: a second daemon_started in the container's
        # log (a restart appends to it), the state running again. Not told by its pid: the
        # restarted container has a fresh pid namespace, where the daemon gets the same pid.
        deadline = time.monotonic() + 90
        while len(started := [e for e in syslog_events(kubelet.logs(pod.name, PERSISTENCED))
                              if e.get("event") == "daemon_started"]) < 2 or \
                daemon_state(node, "persistenced")["state"] != "running":
            assert time.monotonic() < deadline, (started, daemon_state(node, "persistenced"))
            time.sleep(1)
        kubelet.pods[pod.name].terminate(grace_s=5)


def syslog_events(text: str) -> list[dict]:
    """The JSON lines of a container's log."""
    found = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            found.append(doc)
    return found


def test_nvswitch_node_is_ready_through_the_fabric_gate(kubelet, tmp_path):
    ds = rendered("--nvswitch")
    assert init_names(ds) == [FABRIC_MANAGER, INIT]
    version = manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    with ArtifactServer() as server:
        node, _ = ubuntu_node(tmp_path, server)
        node.kernel.add_gpu(device="0x2330")  # HGX H100: NVML keeps its fabric state (an L4 reads N/A)
        node.kernel.add_nvswitch()
        node.env["NVIDIA_FABRIC_MANAGER_BASE_URL"] = fabricmanager.serve(server, version)
        pod = kubelet.run(node, pod_name("nvswitch"), ds)
    assert_installed(node, pod, version, "fresh")
    seen = [e["event"] for e in pod.events]
    assert "fabric_manager_installed" in seen
    assert seen.index("fabric_waiting") < seen.index("fabric_completed") < seen.index(
        "cuda_check_ok"), seen
    sidecar = pod.sidecars[FABRIC_MANAGER]
    assert sidecar["State"]["Status"] == "running"
    assert at(sidecar) < at(pod.init) < at(pod.pause)
    logs = kubelet.logs(pod.name, FABRIC_MANAGER)
    assert f"Fabric Manager version {version} is running" in logs, logs
    assert daemon_state(node, "fabricmanager")["state"] == "running"
    fields = ready_fields(node)
    assert fields["NVLINK_FABRIC"] == "completed" and fields["DAEMONS"] == "fabricmanager"

"""Fixture GPU nodes for the pod tier, and one DaemonSet pod run on them by podman.

A node is a fixture root tree (tests/fixtures/node.py) with a fake kernel and a
local HTTPS artifact server; the seams are those tests/test_images.py uses: the
fake kernel's state dir bound at its own path, its kmod stand-ins and a fake
apt-get first on the image's PATH (/usr/local/sbin), the server's CA bundle,
and the env vars pointing the installer at all of them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from installer.commands.manifests import values
from tests.fixtures.kernel import HOOK_DIR, FakeKernel
from tests.fixtures.node import COS_KERNEL, UBUNTU_KERNEL, Node, build_cos_node, build_ubuntu_node
from tests.fixtures.server import ArtifactServer
from tests.pod import FAKE_APT_GET
from tests.pod import events as parse_events
from tests.pod_tier.lifecycle import PodLifecycle, is_sidecar
from tests.pod_tier.podman import POD_CONTAINER, Podman
from tests.pod_tier.podspec import Seams, pod_from_daemonset

REPO = Path(__file__).resolve().parents[2]
INIT = "nvidia-driver-installer"  # the init container's name in both manifests
PAUSE = "pause"
# Both images have /usr/bin/python3.11 (bookworm's; the Ubuntu image installs it
# by name), not always /usr/bin/python3: the kmod stand-in runs with it.
IMAGE_PYTHON = "/usr/bin/python3.11"


def committed_daemonset(flavor: str) -> dict:
    import yaml

    return yaml.safe_load((REPO / "manifests" / values.daemonset_filename(flavor)).read_text())


def gke_daemonset(flavor: str) -> dict:
    """GKE's own DaemonSet for the flavour, as test data (tests/pod_tier/gke/ says what)."""
    import yaml

    return yaml.safe_load((Path(__file__).with_name("gke") / f"daemonset-{flavor}.yaml").read_text())


def role_images(ds: dict, installer: str, pause: str) -> dict[str, str]:
    """{the DaemonSet's installer image: installer, its pause image: pause}."""
    spec = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c["image"] for c in spec["initContainers"] + spec["containers"]}
    return {containers[INIT]: installer, containers[PAUSE]: pause}


@dataclass
class FixtureNode:
    flavor: str
    node: Node
    kernel: FakeKernel
    server: ArtifactServer
    sbin: Path  # mounted at /usr/local/sbin in the init container
    env: dict[str, str]  # the seams' env beyond the fake kernel's

    @classmethod
    def build(cls, flavor: str, work: Path, server: ArtifactServer, env: dict[str, str]) -> FixtureNode:
        release = COS_KERNEL if flavor == "cos" else UBUNTU_KERNEL
        kernel = FakeKernel(work / "kernel", release)
        kernel.add_gpu()
        build = build_cos_node if flavor == "cos" else build_ubuntu_node
        node = build(work / "node", kernel_release=release)
        sbin = work / "sbin"
        shutil.copytree(kernel.bin_dir, sbin, symlinks=True)
        fakekmod = sbin / "fakekmod"
        lines = fakekmod.read_text().split("\n", 1)
        fakekmod.write_text(f"#!{IMAGE_PYTHON}\n{lines[1]}")
        (sbin / "apt-get").write_text(FAKE_APT_GET)
        (sbin / "apt-get").chmod(0o755)
        return cls(flavor, node, kernel, server, sbin, env)

    def seams(self) -> Seams:
        ca_dir = Path(self.server.ca_bundle_path).parent
        return Seams(
            env={**self.kernel.env(), "REQUESTS_CA_BUNDLE": self.server.ca_bundle_path, **self.env},
            mounts=((self.kernel.root, str(self.kernel.root)), (ca_dir, str(ca_dir)),
                    (HOOK_DIR, str(HOOK_DIR)),
                    (self.sbin, "/usr/local/sbin")))


@dataclass
class PodContainers:
    """lifecycle.Runtime over podman: one pod's containers by their manifest names."""

    podman: Podman
    pod: str

    def id(self, name: str) -> str:
        return POD_CONTAINER.format(pod=self.pod, container=name)

    def start(self, name: str) -> None:
        self.podman("start", self.id(name))

    def state(self, name: str) -> tuple[str, int]:
        state = self.podman.inspect(self.id(name))["State"]
        return state["Status"], state["ExitCode"]

    def stop(self, name: str, grace_s: float) -> None:
        self.podman("stop", "--time", str(int(grace_s)), self.id(name), check=False,
                    timeout=grace_s + 60)


@dataclass
class PodRun:
    name: str
    phase: str  # lifecycle.RUNNING, or FAILED when an init container failed
    failed: str | None  # that init container
    init: dict  # podman inspect of the installer's init container
    pause: dict
    logs: str  # the installer's
    sidecars: dict[str, dict]  # podman inspect of each native sidecar, by name

    @property
    def events(self) -> list[dict]:
        return [e for e in parse_events(self.logs) if "event" in e]

    @property
    def last_line(self) -> str:
        return self.logs.rstrip("\n").rsplit("\n", 1)[-1]


class Kubelet:
    """Plays DaemonSet pods on fixture nodes in the kubelet's order (lifecycle.py); stops
    and removes every pod it made, also when a run is interrupted (SIGTERM) or times out."""

    def __init__(self, podman: Podman, images: dict[str, str]):
        self.podman = podman
        self.images = images
        self.pods: dict[str, PodLifecycle] = {}

    def run(self, node: FixtureNode, name: str, daemonset: dict | None = None,
            timeout: float = 600) -> PodRun:
        """A pod of ``daemonset`` (default: the committed manifest of the node's flavour)."""
        pod = pod_from_daemonset(daemonset or committed_daemonset(node.flavor), name=name,
                                 node_root=node.node.root, images=self.images, seams=node.seams())
        containers = PodContainers(self.podman, name)
        life = self.pods[name] = PodLifecycle(pod["spec"], containers)
        created = self.podman.create_pod(pod)
        # A pod podman refused (a bad spec, a missing hostPath) has no containers.
        assert self.podman.pod_exists(name), f"podman kube play: {created.stderr[-3000:]}"
        try:
            life.start(timeout)
        except BaseException:  # SIGTERM (KeyboardInterrupt here), a deadline: stop it now
            life.terminate(grace_s=0)
            raise
        sidecars = {c["name"]: self.podman.inspect(containers.id(c["name"]))
                    for c in pod["spec"]["initContainers"] if is_sidecar(c)}
        return PodRun(name, life.phase, life.failed, self.podman.inspect(containers.id(INIT)),
                      self.podman.inspect(containers.id(PAUSE)),
                      self.podman.logs(containers.id(INIT)), sidecars)

    def logs(self, pod: str, container: str) -> str:
        return self.podman.logs(PodContainers(self.podman, pod).id(container))

    def remove(self, name: str) -> None:
        life = self.pods.pop(name, None)
        if life is not None:
            life.terminate(grace_s=5)
        self.podman.remove_pod(name)
        assert not self.podman.pod_exists(name), f"pod {name} could not be removed"

    def close(self) -> None:
        for name in list(self.pods):
            self.remove(name)

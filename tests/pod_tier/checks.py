"""Fixture nodes and what the pod-tier tests assert about a pod run and its node."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from installer.commands.manifests import values
from tests.fixtures.runfile import build_driver_run
from tests.fixtures.server import ArtifactServer
from tests.pod_tier.lifecycle import RUNNING
from tests.pod_tier.workload import FixtureNode, PodRun, committed_daemonset

HOST_LIB64 = f"{values.INSTALL_DIR_HOST}/lib64"


def manifest_env(flavor: str) -> dict[str, str]:
    (init,) = committed_daemonset(flavor)["spec"]["template"]["spec"]["initContainers"]
    return {e["name"]: e["value"] for e in init["env"]}


def pod_name(label: str) -> str:
    return f"ndi-{label}-{os.getpid()}"


def ubuntu_node(work: Path, server: ArtifactServer, *, version: str | None = None,
                serve: str = "run") -> tuple[FixtureNode, str]:
    """An Ubuntu node; ``version`` (default: our manifest's pin) on the server ("run"), a
    corrupt copy of it ("corrupt") or nothing ("none": a 404). Returns (node, .run path)."""
    version = version or manifest_env("ubuntu")["NVIDIA_DRIVER_VERSION"]
    run = build_driver_run(work / "runs", version)
    path = f"/tesla/{version}/{run.name}"
    if serve == "run":
        server.serve(path, run)
    elif serve == "corrupt":
        data = bytearray(run.read_bytes())
        data[len(data) // 2: len(data) // 2 + 4] = b"XXXX"
        server.serve(path, bytes(data))
    node = FixtureNode.build("ubuntu", work, server, {"NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla"})
    return node, path


def cos_node(work: Path, server: ArtifactServer, version: str) -> FixtureNode:
    """A COS node; the build's artifacts (Bucket) and NVIDIA's ``version`` on the server."""
    from tests.cosbucket import Bucket, env_recording_run

    run = env_recording_run(work / "runs", version)
    server.serve(f"/tesla/{version}/{run.name}", run)
    bucket = Bucket(work / "bucket")
    bucket.write()
    return FixtureNode.build("cos", work, server, {
        "NVIDIA_DRIVER_BASE_URL": f"{server.url}/tesla", "COS_DOWNLOAD_GCS": bucket.serve(server)})


def assert_ran(node: FixtureNode, pod: PodRun, version: str, plan: str) -> None:
    """Whatever the manifest: the pod installed (or loaded) ``version`` on the node as
    docs/contract.md §4 says, said so last, and its pause container runs."""
    assert pod.phase == RUNNING, pod.logs[-3000:]
    assert (pod.init["State"]["Status"], pod.init["State"]["ExitCode"]) == ("exited", 0)
    assert pod.pause["State"]["Status"] == "running"
    final = json.loads(pod.last_line)
    assert (final["event"], final["outcome"], final["plan"], final["driver_version"]) == \
        ("install_finished", "ok", plan, version), final
    (ready,) = [e for e in pod.events if e["event"] == "plan_ready"]
    assert ready["kind"] == plan
    install = node.node.install_dir
    for rel in ("bin/nvidia-smi", "bin/nvidia-modprobe", "lib64/libnvidia-ml.so.1",
                "lib64/libcuda.so.1", "drivers/nvidia.ko", "drivers/nvidia-uvm.ko",
                "drivers/nvidia-modeset.ko", "drivers/nvidia-drm.ko"):
        assert (install / rel).exists(), rel
    assert json.loads((install / "status.json").read_text())["outcome"] == "ok"
    assert node.node.path("/etc/ld.so.conf.d/nvidia.conf").read_text() == HOST_LIB64 + "\n"
    assert node.node.path("/etc/ld.so.cache").is_file()
    # What a node gets (README "What a node gets"): nvidia and nvidia-uvm, no display modules.
    loaded = set(node.kernel.loaded())
    assert {"nvidia", "nvidia_uvm"} <= loaded and not {"nvidia_modeset", "nvidia_drm"} & loaded
    assert {"nvidiactl", "nvidia0", "nvidia-uvm"} <= set(node.kernel.devices())
    # The container's writes stayed in it: nothing reached this machine's own paths.
    assert not shutil.which("nvidia-smi") and not Path(values.INSTALL_DIR_HOST).exists()


def assert_installed(node: FixtureNode, pod: PodRun, version: str, plan: str) -> None:
    """A pod of our manifest: assert_ran, its pause container unprivileged as the manifest
    says, and our .cache record."""
    assert_ran(node, pod, version, plan)
    assert pod.pause["Config"]["User"] == "65535:65535"
    assert not pod.pause["HostConfig"]["Privileged"] and pod.init["HostConfig"]["Privileged"]
    cache = (node.node.install_dir / ".cache").read_text()
    assert f"CACHE_NVIDIA_DRIVER_VERSION={version}\n" in cache
    key = "CACHE_BUILD_ID=" if node.flavor == "cos" else f"CACHE_KERNEL_VERSION={node.kernel.release}\n"
    assert key in cache

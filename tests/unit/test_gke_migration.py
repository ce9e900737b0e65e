"""Switching from GKE's installer (issue 26): GKE's partition-gpus init container where GKE
runs it, and what doctor sees of GKE's own installer on the node.

GKE's COS DaemonSets (container-engine-accelerators nvidia-driver-installer/cos/
daemonset-preloaded.yaml and -latest.yaml @068b15a, L72-74 and L111-127) run, after the
installer init container:

    - image: "gcr.io/gke-release/nvidia-partition-gpu@sha256:c54fd0…71c2"
      name: partition-gpus
      env: [{name: LD_LIBRARY_PATH, value: /usr/local/nvidia/lib64}]
      securityContext: {privileged: true}
      volumeMounts: nvidia-install-dir-host at /usr/local/nvidia, dev at /dev,
                    nvidia-config (hostPath /etc/nvidia) at /etc/nvidia

and its ubuntu/*.yaml have none.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from installer.commands.manifests import values
from installer.commands.manifests.cli import manifests

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

GKE_PARTITION_IMAGE = ("gcr.io/gke-release/nvidia-partition-gpu@sha256:"
                       "c54fd003948fac687c2a93a55ea6e4d47ffbd641278a9191e75e822fe72471c2")


def _render(*args: str):
    return CliRunner().invoke(manifests, ["render", *args])


def _daemonsets(*args: str) -> dict[str, dict]:
    result = _render(*args)
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return {d["metadata"]["name"].removeprefix("nvidia-driver-installer-"): d for d in docs}


def _pod(ds: dict) -> dict:
    return ds["spec"]["template"]["spec"]


def test_partition_gpus_runs_after_the_install_as_in_gkes_cos_daemonset():
    ds = _daemonsets("--all", "--partition-gpus")
    installer, partition = _pod(ds["cos"])["initContainers"]
    assert installer["name"] == "nvidia-driver-installer"
    assert partition["name"] == "partition-gpus" and partition["image"] == GKE_PARTITION_IMAGE
    assert partition["env"] == [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}]
    assert partition["securityContext"] == {"privileged": True}
    assert {v["name"]: v["mountPath"] for v in partition["volumeMounts"]} == {
        "nvidia-install-dir-host": "/usr/local/nvidia", "dev": "/dev",
        "nvidia-config": "/etc/nvidia"}
    volumes = {v["name"]: v["hostPath"]["path"] for v in _pod(ds["cos"])["volumes"]}
    assert volumes["nvidia-config"] == "/etc/nvidia"
    assert volumes["nvidia-install-dir-host"] == "/home/kubernetes/bin/nvidia"
    # GKE's Ubuntu DaemonSets run none: neither does ours.
    assert [c["name"] for c in _pod(ds["ubuntu"])["initContainers"]] == ["nvidia-driver-installer"]
    kubernetes_validate.validate(ds["cos"], kubernetes_validate.latest_version(), strict=True)


def test_partition_gpus_is_opt_in():
    ds = _daemonsets("--all")
    for flavor in values.FLAVORS:
        assert len(_pod(ds[flavor])["initContainers"]) == 1
        assert "nvidia-config" not in {v["name"] for v in _pod(ds[flavor])["volumes"]}


def test_partition_gpus_for_ubuntu_alone_is_refused():
    result = _render("--flavor", "ubuntu", "--partition-gpus")
    assert result.exit_code == 2 and "only in its cos DaemonSets" in result.output

"""The pod the tier plays is the committed manifest's pod template, changed only where
tests/pod_tier/podspec.py says (runs in the default test run: no podman needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from installer.commands.manifests import values
from tests.pod_tier.podman import INIT_TYPE_ANNOTATION
from tests.pod_tier.podspec import Seams, differences, pod_from_daemonset
from tests.pod_tier.workload import committed_daemonset


@pytest.mark.parametrize("flavor", values.FLAVORS)
def test_only_images_host_root_seams_and_podman_settings_change(flavor):
    ds = committed_daemonset(flavor)
    template = ds["spec"]["template"]
    spec = template["spec"]
    (init,) = spec["initContainers"]
    images = {c["image"]: f"localhost/local-{i}:t"
              for i, c in enumerate(spec["initContainers"] + spec["containers"])}
    overridden = init["env"][0]["name"]
    seams = Seams(env={overridden: "/elsewhere", "NVIDIA_INSTALLER_PROC_DIR": "/k/proc"},
                  mounts=((Path("/k"), "/k"), (Path("/sbin-fakes"), "/usr/local/sbin")))

    pod = pod_from_daemonset(ds, name="p1", node_root=Path("/n"), images=images, seams=seams)

    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert pod["metadata"]["annotations"] == {INIT_TYPE_ANNOTATION: "always"}
    assert pod["metadata"]["labels"] == template["metadata"]["labels"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert host_paths["root-mount"] == "/n" and host_paths["dev"] == "/dev"
    assert host_paths["nvidia-install-dir-host"] == "/n/home/kubernetes/bin/nvidia"
    n_env, n_vols, n_mounts = len(init["env"]), len(spec["volumes"]), len(init["volumeMounts"])
    expected = {
        "metadata.name", "metadata.annotations", "spec.restartPolicy",
        "spec.initContainers[0].image", "spec.containers[0].image",
        "spec.initContainers[0].env[0].value", f"spec.initContainers[0].env[{n_env}]",
        f"spec.volumes[{n_vols}]", f"spec.volumes[{n_vols + 1}]",
        f"spec.initContainers[0].volumeMounts[{n_mounts}]",
        f"spec.initContainers[0].volumeMounts[{n_mounts + 1}]",
        *(f"spec.volumes[{i}].hostPath.path" for i, v in enumerate(spec["volumes"])
          if v["hostPath"]["path"] != "/dev"),
    }
    assert set(differences(template, {k: pod[k] for k in ("metadata", "spec")})) == expected
    assert ds == committed_daemonset(flavor), "the committed manifest itself is not modified"


def test_an_image_without_a_local_build_is_refused():
    ds = committed_daemonset("cos")
    with pytest.raises(KeyError, match="no local image for registry.k8s.io/pause"):
        pod_from_daemonset(ds, name="p", node_root=Path("/n"), seams=Seams(),
                           images={ds["spec"]["template"]["spec"]["initContainers"][0]["image"]: "x"})


def test_the_daemon_sidecars_get_the_seams_and_keep_their_restart_policy():
    """`manifests render --nvswitch --persistenced`: the sidecars run on the node as the
    install does (the same fakes), and stay native sidecars for lifecycle.py."""
    from installer.commands.manifests.render import RenderOptions, render

    ds = yaml.safe_load(render("ubuntu", RenderOptions(nvswitch=True, persistenced=True)))
    spec = ds["spec"]["template"]["spec"]
    images = {c["image"]: "localhost/x:t" for c in spec["initContainers"] + spec["containers"]}
    seams = Seams(env={"NVIDIA_INSTALLER_PROC_DIR": "/k/proc"}, mounts=((Path("/k"), "/k"),))

    pod = pod_from_daemonset(ds, name="p1", node_root=Path("/n"), images=images, seams=seams)

    inits = pod["spec"]["initContainers"]
    assert [(c["name"], c.get("restartPolicy")) for c in inits] == [
        ("nvidia-fabricmanager", "Always"), ("nvidia-persistenced", "Always"),
        ("nvidia-driver-installer", None)]
    for c in inits:
        assert {"name": "NVIDIA_INSTALLER_PROC_DIR", "value": "/k/proc"} in c["env"], c["name"]
        assert {"name": "test-seam-0", "mountPath": "/k"} in c["volumeMounts"], c["name"]
    assert [v["name"] for v in pod["spec"]["volumes"]].count("test-seam-0") == 1

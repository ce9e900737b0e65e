"""A committed DaemonSet's pod template as a `kind: Pod` that `podman kube play` runs.

Only these change (the pod is otherwise the committed manifest's, field for field):

- the image names, to the locally built ones;
- the host's ``/`` becomes a fixture node root: every hostPath under it is
  rebased there, except ``/dev``, which stays this machine's (a node's /dev);
- the test seams (tests/fixtures/README.md): env vars (fake kernel state, the
  local artifact server and its CA) and hostPath mounts of the same fakes, on
  every init container (the install and its daemon sidecars all run on the node);
- what podman 4.3.1 needs to run it like a kubelet: ``restartPolicy: Never``
  (its init containers inherit the pod's policy and restart in a loop
  otherwise; a DaemonSet's pod is Always, but a kubelet never restarts a
  succeeded init container; a failed install fails the pod, once) and the
  annotation that keeps a finished init container with its logs and exit code.

podman creates the containers; tests/pod_tier/lifecycle.py starts them in the
kubelet's order, native sidecars (``restartPolicy: Always``) included.

``hostPID`` is left as it is, though `kube play` 4.3.1 ignores it: no test here
needs the host's PIDs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from tests.pod_tier.podman import INIT_TYPE_ANNOTATION

KEEP_HOST_PATHS = ("/dev",)


@dataclass(frozen=True)
class Seams:
    env: dict[str, str] = field(default_factory=dict)  # set on each init container
    mounts: tuple[tuple[Path, str], ...] = ()  # (this machine's dir, mountPath) in each init container


def rebase(host_path: str, node_root: Path) -> str:
    if host_path in KEEP_HOST_PATHS:
        return host_path
    return str(node_root / host_path.lstrip("/"))


def pod_from_daemonset(ds: dict, *, name: str, node_root: Path, images: dict[str, str],
                       seams: Seams) -> dict:
    """The Pod for `podman kube play`; `images` maps each manifest image to a local one."""
    template = copy.deepcopy(ds["spec"]["template"])
    spec = template["spec"]
    spec["restartPolicy"] = "Never"
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["image"] not in images:
            raise KeyError(f"no local image for {c['image']} (have {sorted(images)})")
        c["image"] = images[c["image"]]
    for vol in spec.get("volumes", []):
        if "hostPath" in vol:
            vol["hostPath"]["path"] = rebase(vol["hostPath"]["path"], node_root)
    for i, (source, _) in enumerate(seams.mounts):
        spec.setdefault("volumes", []).append(
            {"name": f"test-seam-{i}", "hostPath": {"path": str(source), "type": "Directory"}})
    for init in spec["initContainers"]:
        _add_seams(init, seams)
    metadata = template.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**metadata, "name": name,
                     "annotations": {**metadata.get("annotations", {}), INIT_TYPE_ANNOTATION: "always"}},
        "spec": spec,
    }


def _add_seams(container: dict, seams: Seams) -> None:
    env = container.setdefault("env", [])
    for key, value in seams.env.items():
        entry = next((e for e in env if e["name"] == key), None)
        if entry is None:
            env.append({"name": key, "value": value})
        else:
            entry["value"] = value
    for i, (_, target) in enumerate(seams.mounts):
        container.setdefault("volumeMounts", []).append({"name": f"test-seam-{i}", "mountPath": target})


def differences(a, b, path: str = "") -> list[str]:
    """Paths (``spec.volumes[0].hostPath.path``) where two YAML documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += differences(a.get(key), b.get(key), sub) if key in a and key in b else [sub]
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{path}[{i}]" for i in range(min(len(a), len(b)), max(len(a), len(b)))]
        for i, (x, y) in enumerate(zip(a, b, strict=False)):  # the surplus is listed above
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [path]

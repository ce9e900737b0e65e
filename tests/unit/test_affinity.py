"""No two distros' DaemonSets select the same node, whatever the affinity mode.

The rendered nodeAffinity is evaluated as the scheduler does (nodeSelectorTerms ORed, their
matchExpressions ANDed; In / NotIn / Exists / DoesNotExist) against sample nodes.
"""

from __future__ import annotations

import itertools

import pytest
import yaml
from click.testing import CliRunner

from installer.commands.manifests import values
from installer.commands.manifests.cli import manifests
from installer.distros import DISTROS

GKE_OS = ("cos", "cos_containerd", "ubuntu", "ubuntu_containerd", None)
NFD_OS = ("cos", "ubuntu", "debian", "pop", None)


def _nodes() -> list[dict[str, str]]:
    """GKE and NFD label sets, GPU or not, driver managed by GKE or not, custom labels."""
    nodes = []
    for gke_os, nfd_os, gpu, gke_driver, custom in itertools.product(
            GKE_OS, NFD_OS, (True, False), (True, False), (None, "a", "b")):
        labels = {}
        if gke_os:
            labels["cloud.google.com/gke-os-distribution"] = gke_os
        if nfd_os:
            labels[values.OS_ID_LABEL] = nfd_os
        if gpu:
            labels["cloud.google.com/gke-accelerator"] = "nvidia-l4"
            labels["nvidia.com/gpu.present"] = "true"
        if gke_driver:
            labels["cloud.google.com/gke-gpu-driver-version"] = "default"
        if custom:
            labels["pool.example/gpu"] = custom
        nodes.append(labels)
    return nodes


def _matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op = expr["key"], expr["operator"]
    if op == "In":
        return key in labels and labels[key] in expr["values"]
    if op == "NotIn":
        return key not in labels or labels[key] not in expr["values"]
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not evaluated here")


def _terms(daemonset: dict) -> list[dict]:
    affinity = daemonset["spec"]["template"]["spec"]["affinity"]
    return affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def selects(daemonset: dict, labels: dict[str, str]) -> bool:
    if "affinity" not in daemonset["spec"]["template"]["spec"]:
        return True
    return any(all(_matches(e, labels) for e in t["matchExpressions"])
               for t in _terms(daemonset))


def _render(*args: str) -> dict[str, dict]:
    result = CliRunner().invoke(manifests, ["render", "--all", *args])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return {d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in docs}


MODES = {
    "gke": (),
    "label-default": ("--affinity", "label"),
    "label-readme": ("--affinity", "label", "--node-label", "nvidia.com/gpu.present=true"),
    "label-key-only": ("--affinity", "label", "--node-label", "pool.example/gpu"),
    "label-flavor-key": ("--affinity", "label", "--node-label", "pool.example/{flavor}"),
    "label-flavor-value": ("--affinity", "label", "--node-label", "pool.example/gpu={flavor}"),
}


@pytest.mark.parametrize("args", MODES.values(), ids=MODES.keys())
def test_no_node_is_selected_by_two_flavors(args):
    daemonsets = _render(*args)
    assert sorted(daemonsets) == sorted(values.FLAVORS)
    for a, b in itertools.combinations(daemonsets.values(), 2):
        both = [n for n in _nodes() if selects(a, n) and selects(b, n)]
        assert both == [], (a["metadata"]["name"], b["metadata"]["name"])


@pytest.mark.parametrize("args", [MODES["gke"], MODES["label-readme"]], ids=["gke", "label"])
def test_each_flavor_still_selects_its_own_gpu_nodes(args):
    daemonsets = _render(*args)
    for distro in DISTROS:
        node = _gpu_node(**{values.OS_ID_LABEL: distro.os_ids[0]})
        if distro.gke_os_distributions:  # GKE labels the nodes of its own images only
            node["cloud.google.com/gke-os-distribution"] = distro.gke_os_distributions[0]
        assert selects(daemonsets[distro.name], node), distro.name


def test_label_mode_adds_the_os_only_when_the_labels_do_not_name_the_flavor():
    readme = _render(*MODES["label-readme"])["cos"]
    exprs = _terms(readme)[0]["matchExpressions"]
    assert exprs[-1] == {"key": values.OS_ID_LABEL, "operator": "In", "values": ["cos"]}
    own = _render(*MODES["label-flavor-value"])["cos"]
    keys = [e["key"] for e in _terms(own)[0]["matchExpressions"]]
    assert keys == ["pool.example/gpu", *(g["key"] for g in values.GKE_GUARDS)]


def test_affinity_none_for_both_flavors_is_refused():
    result = CliRunner().invoke(manifests, ["render", "--all", "--affinity", "none"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "Error: --affinity none puts every flavor on every node: render one --flavor, or use "
        "--affinity gke or label")
    assert "Traceback" not in result.output
    one = CliRunner().invoke(manifests, ["render", "--flavor", "cos", "--affinity", "none"])
    assert one.exit_code == 0 and "nodeAffinity" not in one.output


def test_flavor_named_label_keys_exclude_each_other_without_nfd():
    cos = _render("--affinity", "label", "--node-label", "example.com/os-{flavor}")["cos"]
    exprs = _terms(cos)[0]["matchExpressions"]
    assert exprs == [{"key": "example.com/os-cos", "operator": "Exists"}, *values.GKE_GUARDS,
                     {"key": "example.com/os-ubuntu", "operator": "DoesNotExist"},
                     {"key": "example.com/os-debian", "operator": "DoesNotExist"}]
    assert selects(cos, {"example.com/os-cos": "1"})
    assert not selects(cos, {"example.com/os-cos": "1", "example.com/os-ubuntu": "1"})


def _gpu_node(**labels: str) -> dict[str, str]:
    return {"nvidia.com/gpu.present": "true", "cloud.google.com/gke-accelerator": "nvidia-l4",
            **labels}


@pytest.mark.parametrize("args", [MODES["label-default"], MODES["label-readme"]],
                         ids=["default-labels", "readme-labels"])
def test_label_affinity_selects_every_os_its_flow_serves(args):
    """The flow that serves Debian once required ID=ubuntu: Debian nodes never matched."""
    daemonsets = _render(*args)
    for distro in DISTROS:
        for os_id in distro.os_ids:
            node = _gpu_node(**{values.OS_ID_LABEL: os_id})
            chosen = [f for f, d in daemonsets.items() if selects(d, node)]
            assert chosen == [distro.name], (os_id, chosen)


def _expressions(daemonset: dict) -> list[dict]:
    return [e for t in _terms(daemonset) for e in t["matchExpressions"]]


def test_a_distro_gke_has_no_image_of_renders_no_empty_in(monkeypatch):
    """``In []`` is invalid (k8s.io/api core/v1 NodeSelectorRequirement.Values: "If the
    operator is In or NotIn, the values array must be non-empty") and leaving the OS out
    would put the DaemonSet on every GKE GPU node: no GKE OS label and the node's
    os-release ID stand in for it."""
    monkeypatch.setitem(values.GKE_OS_DISTRIBUTIONS, "ubuntu", ())  # as Debian's
    daemonsets = _render()
    for daemonset in daemonsets.values():
        assert all(e.get("values") for e in _expressions(daemonset) if e["operator"] == "In")
    for flavor in ("ubuntu", "debian"):
        daemonset = daemonsets[flavor]
        assert {"key": values.OS_ID_LABEL, "operator": "In", "values": [flavor]} in \
            _expressions(daemonset)
        assert selects(daemonset, _gpu_node(**{values.OS_ID_LABEL: flavor}))
        assert not selects(daemonset, _gpu_node(**{values.OS_ID_LABEL: "cos",
                                                   "cloud.google.com/gke-os-distribution": "cos"}))
    for a, b in itertools.combinations(daemonsets.values(), 2):
        assert [n for n in _nodes() if selects(a, n) and selects(b, n)] == []

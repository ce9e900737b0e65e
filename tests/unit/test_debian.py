"""Debian, its own distro: recognised, planned as a headers build, and rendered as its own
DaemonSet (own flavour, os-release ID=debian affinity, the Ubuntu image)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from installer.base.errors import UnsupportedHostError
from installer.commands import bundle_build as build
from installer.commands.manifests import values
from installer.commands.manifests.cli import manifests
from installer.distros import Debian
from installer.distros.flows import for_host
from installer.distros.headers_build_flow import HeadersBuildFlow
from tests.fixtures.node import COS_113, DEBIAN_12
from tests.unit.test_ubuntu_plan import FRESH_STEPS, Env, names


@pytest.fixture
def env(tmp_path, monkeypatch):
    e = Env(tmp_path, monkeypatch)
    (e.node.root / "etc/os-release").write_text(DEBIAN_12)
    e.add_gpu()
    return e


def test_a_debian_node_gets_the_debian_flow_and_the_headers_build_plan(env):
    ctx = env.ctx()
    distro = for_host(ctx.host_info)
    assert distro.distro is Debian and isinstance(distro, HeadersBuildFlow)
    assert (ctx.host_info.os_id, ctx.host_info.distro) == ("debian", "debian")
    assert Debian.support(ctx.host_info) == "supported"
    plan = distro.plan(ctx)
    assert plan.kind == "fresh" and names(plan) == FRESH_STEPS
    assert plan.summary["driver_version"] == Debian.default_version


def test_bundle_build_uses_the_hosts_headers_build(env, tmp_path):
    plan = build.plan(env.ctx(), tmp_path / "out", None)
    assert names(plan)[0] == "find_kernel_headers" and names(plan)[-1] == "write_bundle"


def test_bundle_build_refuses_a_distro_it_cannot_compile_for(env, tmp_path):
    (env.node.root / "etc/os-release").write_text(COS_113)
    with pytest.raises(UnsupportedHostError, match="compiles against kernel headers"):
        build.plan(env.ctx(), tmp_path / "out", None)


def _render(*args: str) -> dict:
    result = CliRunner().invoke(manifests, ["render", "--flavor", "debian", *args])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize("affinity", ["gke", "label"])
def test_its_daemonset_requires_a_debian_node(affinity):
    pod = _render("--affinity", affinity)["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": values.OS_ID_LABEL, "operator": "In", "values": ["debian"]} in \
        term["matchExpressions"]
    assert all(e.get("values") for e in term["matchExpressions"] if e["operator"] == "In")


def test_its_daemonset_runs_the_ubuntu_image_with_boot_and_the_pod_network():
    ds = _render()
    assert ds["metadata"]["name"] == "nvidia-driver-installer-debian"
    pod = ds["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == values.default_image("ubuntu")
    assert {"name": "boot", "mountPath": "/boot"} in init["volumeMounts"]
    assert "hostNetwork" not in pod
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["NVIDIA_DRIVER_VERSION"] == Debian.default_version
    assert not any(k.startswith("COS_") for k in env)

"""`manifests render` as an operator uses it (issue 34): what it accepts matches what the
installer accepts, every image is pinned or warned about, and the options a fleet needs."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from installer.distros import DISTROS
from installer.manifests.cli import manifests


def render(*args: str):
    return CliRunner().invoke(manifests, ["render", *args])


def init_env(result) -> dict[str, str]:
    (ds,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet"]
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    return {e["name"]: e.get("value") for e in init["env"]}


@pytest.mark.parametrize("flavor", [d.name for d in DISTROS])
def test_render_accepts_default_wherever_install_does(flavor):
    """`install --driver-version default` is every distro's default; render takes it too."""
    result = render("--flavor", flavor, "--driver-version", "default")
    assert result.exit_code == 0, result.output
    assert init_env(result)["NVIDIA_DRIVER_VERSION"] == "default"


def test_render_refuses_an_alias_install_refuses():
    result = render("--flavor", "ubuntu", "--driver-version", "latest")
    assert result.exit_code == 2
    assert "nor an alias (default:" in result.output


def test_bundle_job_builds_the_module_type_r580_nodes_ask_for():
    """Nodes pick open modules on R580 (auto, Turing or newer GPUs): the Job's default must
    build those, or every bundle goes unused (or exit 5 with --prebuilt-only)."""
    from installer.bundle.job import built_module_type

    result = render("--kind", "bundle-job", "--target", "580.82.07@6.8.0-1015-gke",
                    "--volume-claim", "bundles")
    assert result.exit_code == 0, result.output
    (job,) = [d for d in yaml.safe_load_all(result.stdout) if d]
    (build,) = [c for c in job["spec"]["template"]["spec"]["initContainers"]
                if c["name"] == "build"]
    env = {e["name"]: e["value"] for e in build["env"]}
    assert env["NVIDIA_KERNEL_MODULE_TYPE"] == "auto"
    assert built_module_type("580.82.07", "auto") == "open"
    assert built_module_type("535.183.01", "auto") == "proprietary"  # before R560

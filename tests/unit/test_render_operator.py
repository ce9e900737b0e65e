"""`manifests render` as an operator uses it (issue 34): what it accepts matches what the
installer accepts, every image is pinned or warned about, and the options a fleet needs."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from installer.commands.manifests.cli import manifests
from installer.commands.manifests.values import OS_ID_LABEL
from installer.distros import DISTROS


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
    from installer.commands.manifests.bundle_job import built_module_type

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


SHA = "sha256:" + "ab" * 32
PAUSE_PINNED = "registry.k8s.io/pause:3.10@" + SHA


def _images(result) -> dict[str, str]:
    (ds,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    return {c["name"]: c["image"] for c in spec["initContainers"] + spec["containers"]}


def test_the_default_image_is_a_marked_placeholder_of_no_real_registry():
    """Nothing is published (issue 34 §3): the default names registry.invalid, the manifest
    says PLACEHOLDER and how to get real images, and stderr says so."""
    result = render("--flavor", "ubuntu")
    assert result.exit_code == 0, result.output
    assert _images(result)["nvidia-driver-installer"].startswith("registry.invalid/")
    assert "# PLACEHOLDER: no image of this project is published" in result.stdout
    assert "placeholder registry registry.invalid" in result.stderr
    assert "make push REGISTRY=" in result.stderr
    mine = render("--flavor", "ubuntu", "--image", "registry.example/ndi-{flavor}:1")
    assert "PLACEHOLDER" not in mine.stdout and "placeholder" not in mine.stderr


def test_every_image_is_pinned_or_warned_about():
    base = ["--flavor", "cos", "--image", "registry.example/ndi-{flavor}:1",
            "--image-digest", "cos=" + SHA, "--partition-gpus"]
    loose = render(*base)
    assert loose.exit_code == 0, loose.output
    assert "the pause image is pinned by tag only (registry.k8s.io/pause:3.10)" in loose.stderr
    assert "# NOT PINNED: render with --pause-image" in loose.stdout
    # GKE's partition-gpus image is pinned by digest: no warning for it by default
    assert "partition-gpus image" not in loose.stderr
    mirror = "mirror.example/partition-gpu:1"
    moved = render(*base, "--pause-image", PAUSE_PINNED, "--partition-gpus-image", mirror)
    assert moved.exit_code == 0, moved.output
    assert _images(moved)["partition-gpus"] == mirror and _images(moved)["pause"] == PAUSE_PINNED
    assert moved.stderr.count("pinned by tag only") == 1
    assert f"the partition-gpus image is pinned by tag only ({mirror})" in moved.stderr


def test_bundle_job_images_are_pinned_or_warned_about():
    args = ["--kind", "bundle-job", "--target", "580.82.07@6.8.0-1015-gke",
            "--uploader-image", "google/cloud-sdk:slim", "--upload-command", "true"]
    result = render(*args, "--image", "registry.example/ndi-ubuntu:1")
    assert result.exit_code == 0, result.output
    assert "the installer image is pinned by tag only" in result.stderr
    assert "the uploader image is pinned by tag only (google/cloud-sdk:slim)" in result.stderr
    pinned = render(*args[:-4], "--volume-claim", "b", "--image",
                    "registry.example/ndi-ubuntu:1@" + SHA)
    assert pinned.exit_code == 0 and "pinned by tag only" not in pinned.stderr


def test_render_pins_the_run_and_turns_metrics_on():
    prom = "/var/lib/node_exporter/textfile_collector/nvidia_driver_installer.prom"
    result = render("--flavor", "ubuntu", "--driver-version", "580.82.07",
                    "--driver-sha256", "AB" * 32, "--metrics-file", prom)
    assert result.exit_code == 0, result.output
    env = init_env(result)
    assert env["NVIDIA_DRIVER_SHA256"] == "ab" * 32
    assert env["NVIDIA_INSTALLER_METRICS_FILE"] == prom
    plain = init_env(render("--flavor", "ubuntu"))
    assert "NVIDIA_DRIVER_SHA256" not in plain and "NVIDIA_INSTALLER_METRICS_FILE" not in plain


@pytest.mark.parametrize(("args", "says"), [
    (("--driver-sha256", "ab" * 32), "give --driver-version"),
    (("--driver-version", "580.82.07", "--driver-sha256", "xyz"), "is not a SHA-256"),
    (("--metrics-file", "metrics.prom"), "not an absolute host path"),
    (("--metrics-file", "/var/lib/x.txt"), "*.prom"),
    (("--metrics-file", "/a.prom", "--env", "NVIDIA_INSTALLER_METRICS_FILE=/b.prom"),
     "both set it"),
])
def test_bad_pins_and_metrics_paths_are_usage_errors(args, says):
    result = render("--flavor", "ubuntu", *args)
    assert result.exit_code == 2 and says in result.output, result.output


def _expressions(result, flavor: str) -> list[dict]:
    (ds,) = [d for d in yaml.safe_load_all(result.stdout)
             if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith(flavor)]
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (term,) = terms
    return term["matchExpressions"]


def test_a_gke_node_pool_label_alone_selects_by_gke_s_own_os_label():
    """Issue 34 §4: a node-pool label only used to require NFD's os-release label, which GKE
    nodes lack: zero pods. GKE's cloud.google.com/gke-os-distribution tells them apart."""
    result = render("--flavor", "cos", "--flavor", "ubuntu", "--affinity", "label",
                    "--node-label", "cloud.google.com/gke-nodepool=gpu-a",
                    "--image", "registry.example/ndi-{flavor}:1")
    assert result.exit_code == 0, result.output
    for flavor, os_values in (("cos", ["cos", "cos_containerd"]),
                              ("ubuntu", ["ubuntu", "ubuntu_containerd"])):
        exprs = _expressions(result, flavor)
        assert {"key": "cloud.google.com/gke-os-distribution", "operator": "In",
                "values": os_values} in exprs
        assert not [e for e in exprs if e["key"] == OS_ID_LABEL]
    assert "Node Feature Discovery" not in result.stderr


def test_a_label_that_leaves_the_os_to_nfd_is_warned_about():
    result = render("--flavor", "cos", "--flavor", "ubuntu", "--affinity", "label",
                    "--node-label", "example.com/gpu-pool=a",
                    "--image", "registry.example/ndi-{flavor}:1")
    assert result.exit_code == 0, result.output
    assert "the cos, ubuntu DaemonSet(s) also require Node Feature Discovery's" in result.stderr
    named = render("--flavor", "cos", "--flavor", "ubuntu", "--affinity", "label",
                   "--node-label", "example.com/os-{flavor}",
                   "--image", "registry.example/ndi-{flavor}:1")
    assert "Node Feature Discovery" not in named.stderr

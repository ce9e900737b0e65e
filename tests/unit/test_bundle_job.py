"""``manifests render --kind bundle-job`` (issue 15): schema-valid, lint-clean, and the
Indexed Job's index really picks one target in ``bundle build``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from installer.base.errors import UsageError
from installer.commands.bundle_cli import pick_target
from installer.commands.manifests.cli import manifests

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")

TARGETS = ("--target", "550.127.05@6.8.0-1015-gke", "--target", "535.216.01@6.8.0-1015-gke")
VARIANTS = {
    "volume": ("--volume-claim", "nvidia-bundles"),
    "upload": ("--uploader-image", "google/cloud-sdk:slim", "--upload-command",
               'gsutil cp "$BUNDLE_DIR"/*.tar.gz "$BUNDLE_DIR"/*.sha256 gs://b/nvidia/'),
    "both": ("--volume-claim", "b", "--uploader-image", "curlimages/curl:8.10.1",
             "--upload-command", "curl -T {} https://b.example/", "--parallelism", "1",
             "--kernel-module-type", "open", "--env", "NVIDIA_DRIVER_BASE_URL=https://m.example/t"),
}


def render(*args: str):
    return CliRunner().invoke(manifests, ["bundle-job", *args])


@pytest.mark.parametrize("spelling", [["render", "--kind", "bundle-job"],
                                      ["render", "--kind=bundle-job"]])
def test_the_older_spelling_renders_the_same_job(spelling, jobs):
    """README shows ``manifests render --kind bundle-job`` as an alias of ``bundle-job``."""
    older = CliRunner().invoke(manifests, [*spelling, *TARGETS, *VARIANTS["volume"]])
    assert older.exit_code == 0, older.output
    assert older.stdout == jobs["volume"]


def test_kind_daemonset_is_plain_render():
    spelled = CliRunner().invoke(manifests, ["render", "--kind", "daemonset", "--flavor", "cos"])
    plain = CliRunner().invoke(manifests, ["render", "--flavor", "cos"])
    assert spelled.exit_code == plain.exit_code == 0, spelled.output
    assert spelled.stdout == plain.stdout
    bad = CliRunner().invoke(manifests, ["render", "--kind", "cronjob"])
    assert bad.exit_code == 2 and "'cronjob' is not one of" in bad.output


@pytest.fixture(scope="module")
def jobs() -> dict[str, str]:
    out = {}
    for name, args in VARIANTS.items():
        result = render(*TARGETS, *args)
        assert result.exit_code == 0, result.output
        out[name] = result.stdout  # stderr: the placeholder image's warning
    return out


def spec(text: str) -> dict:
    (doc,) = [d for d in yaml.safe_load_all(text) if d]
    return doc


@pytest.mark.parametrize("version", ["1.27.0", "1.30.0", kv.latest_version()])
def test_job_is_valid_kubernetes_strict(jobs, version):
    for name, text in jobs.items():
        try:
            kv.validate(spec(text), version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{name} against {version}: {exc.message} at {list(exc.path)}")


def test_job_is_yamllint_clean(jobs, tmp_path):
    for name, text in jobs.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    proc = subprocess.run([str(Path(sys.executable).parent / "yamllint"), "-s", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_one_pod_per_target_each_building_and_indexing(jobs):
    job = spec(jobs["volume"])
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == 2
    pod = job["spec"]["template"]["spec"]
    (build,) = pod["initContainers"]
    assert build["args"] == ["bundle", "build", "--output-dir", "/bundles"]
    env = {e["name"]: e["value"] for e in build["env"]}
    assert env["NVIDIA_BUNDLE_TARGETS"] == "550.127.05@6.8.0-1015-gke 535.216.01@6.8.0-1015-gke"
    assert env["ROOT_MOUNT_DIR"] == "/"
    assert pod["containers"][0]["args"] == ["bundle", "index", "/bundles"]
    assert pod["volumes"] == [{"name": "bundles",
                               "persistentVolumeClaim": {"claimName": "nvidia-bundles"}}]
    # The pod's JOB_COMPLETION_INDEX picks its target.
    assert pick_target(env["NVIDIA_BUNDLE_TARGETS"], 1) == ("535.216.01", "6.8.0-1015-gke")


def test_upload_hook_runs_after_the_build(jobs):
    pod = spec(jobs["upload"])["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["build"]
    (upload,) = pod["containers"]
    assert upload["image"] == "google/cloud-sdk:slim"
    assert upload["command"][:2] == ["sh", "-c"] and "gsutil cp" in upload["command"][2]
    both = spec(jobs["both"])["spec"]["template"]["spec"]
    assert [c["name"] for c in both["initContainers"]] == ["build", "index"]


@pytest.mark.parametrize("args, fragment", [
    ((), "at least one --target"),
    (("--target", "550.127.05", "--volume-claim", "b"), "DRIVER@KERNEL"),
    (("--target", "550.127.05@../../x", "--volume-claim", "b"), "kernel release"),
    (TARGETS[:2] * 2 + ("--volume-claim", "b"), "twice"),
    (TARGETS, "--volume-claim"),
    (TARGETS + ("--uploader-image", "x:1"), "go together"),
    (TARGETS + ("--volume-claim", "Bad_Name"), "DNS subdomain"),
    (TARGETS + ("--volume-claim", "b", "--env", "NVIDIA_DRIVER_VERSION=1.2"), "--driver-version"),
])
def test_bad_job_options_are_usage_errors(args, fragment):
    result = render(*args)
    assert result.exit_code == 2 and fragment in result.output, result.output


@pytest.mark.parametrize("targets, index", [("550.127.05@6.8.0-1015-gke", 1), ("550.127.05", 0),
                                            ("a@b", None)])
def test_bad_target_pick_is_a_usage_error(targets, index):
    with pytest.raises(UsageError):
        pick_target(targets, index)

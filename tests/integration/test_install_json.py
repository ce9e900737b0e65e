"""`install -o json` prints one JSON document on stdout whatever happens (issue 34 §5): the
outcome a successful run prints, and on failure the class, exit code, message and hint
(what status.json records), dry runs and bad options included."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.chroot


def _stdout_doc(proc) -> dict:
    return json.loads(proc.stdout)  # exactly one document: json.loads refuses anything more


def test_a_failed_download_prints_its_outcome(pod, server):
    proc = pod.run("install", "-o", "json", env={"NVIDIA_DRIVER_VERSION": "580.99.99"})
    assert proc.returncode == 5, proc.stderr[-2000:]
    doc = _stdout_doc(proc)
    assert (doc["outcome"], doc["error_class"], doc["exit_code"]) == ("error", "download", 5)
    assert "HTTP 404" in doc["message"] and doc["hint"]
    assert "dry_run" not in doc


def test_a_refused_dry_run_prints_its_outcome(pod, kernel):
    # R470 on the fixture's L4 (a GPU-less node no longer refuses a dry run: issue 41).
    proc = pod.run("install", "--dry-run", "-o", "json", env={"NVIDIA_DRIVER_VERSION": "470.256.02"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    doc = _stdout_doc(proc)
    assert (doc["error_class"], doc["exit_code"], doc["dry_run"]) == ("usage", 2, True)


@pytest.mark.parametrize("args", [("--kernel-release", "5.15/../../etc"), ("--no-such-flag",)])
def test_a_bad_option_prints_its_outcome(pod, args):
    proc = pod.run("install", "--output=json", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert _stdout_doc(proc)["error_class"] == "usage"


def test_text_output_prints_nothing_on_failure(pod, server):
    proc = pod.run("install", env={"NVIDIA_DRIVER_VERSION": "580.99.99"})
    assert proc.returncode == 5 and proc.stdout == ""

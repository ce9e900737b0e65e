"""status.json has one schema (outcome.Outcome), read back by everything that reads it,
including the files earlier installer versions wrote."""

from __future__ import annotations

import json

import pytest

from installer.base.fsutil import UnreadableFile
from installer.records import metrics, status
from installer.records.outcome import Outcome

V1, V2 = "570.172.08", "580.82.07"

# A staged run's status.json as the previous version (main before issue 32) wrote it:
# install._record's dict, the staged version as driver_version, the running one inside
# staged_for_next_boot.
OLD_STAGED = {
    "driver_version": V2,
    "duration_s": 41.2,
    "exit_code": 0,
    "external_commands_s": 12.0,
    "finished_at": "2026-11-20T10:00:00Z",
    "gpus": [{"index": 0, "name": "NVIDIA L4"}],
    "host": {"os_id": "ubuntu", "family": "ubuntu", "kernel_release": "6.8.0-1025-gke"},
    "install_dir_host": "/home/kubernetes/bin/nvidia",
    "installer_version": "0.1.0",
    "outcome": "ok",
    "plan": "staged",
    "staged_for_next_boot": {"holders": "nvidia: 1 reference(s)", "running_version": V1},
    "steps": [{"name": "check_gpus", "duration_s": 0.01}],
}


def test_an_old_staged_status_reads_as_running_and_staged_versions():
    outcome = Outcome.from_status_json(OLD_STAGED)
    assert (outcome.driver_version, outcome.staged_driver_version, outcome.in_use_by) == (
        V1, V2, "nvidia: 1 reference(s)")
    assert outcome.staged and outcome.plan == "staged" and outcome.exit_code == 0
    doc = outcome.to_status_json()
    assert "staged_for_next_boot" not in doc
    assert (doc["driver_version"], doc["staged_driver_version"]) == (V1, V2)


def test_a_new_status_round_trips():
    outcome = Outcome("error", 5, plan="fresh", driver_version=V2, error_class="download",
                      message="404", hint="check the URL", context={"step": "fetch_artifacts"},
                      steps=({"name": "check_gpus", "duration_s": 0.1},), duration_s=3.5)
    doc = json.loads(json.dumps(outcome.to_status_json()))
    assert Outcome.from_status_json(doc) == outcome


@pytest.mark.parametrize("code", ["5", -1, 256, True, 1.0])
def test_an_exit_code_that_is_not_one_is_corrupt(tmp_path, code):
    (tmp_path / "status.json").write_text(json.dumps({"outcome": "error", "exit_code": code}))
    with pytest.raises(UnreadableFile, match="exit_code is"):
        status.read(tmp_path / "status.json")


def test_fields_of_the_wrong_type_read_as_absent():
    outcome = Outcome.from_status_json({"outcome": "error", "exit_code": 3, "message": ["x"],
                                        "context": "step", "steps": {"a": 1}})
    assert (outcome.message, outcome.context, outcome.steps) == (None, None, None)


def test_metrics_of_an_old_staged_status_name_the_running_driver():
    text = metrics.format_metrics(Outcome.from_status_json(OLD_STAGED), kernel_release="6.8")
    assert f'nvidia_driver_installer_info{{driver_version="{V1}"' in text
    assert f'nvidia_driver_installer_staged_for_next_boot{{driver_version="{V2}"}} 1' in text


"""The pod tier's ``podman container inspect`` against podman 4.3's exit race
(tests/pod_tier/podman.py, ``EXITED_WHILE_INSPECTED``): runs in the default test run with a
scripted podman, no podman needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.pod_tier import podman as podman_mod

# The message a fresh-clone CI run's pod tier got (podman 4.3.1, rc 125).
RACE = "Error: read /proc/7699/cgroup: no such process\n"
EXITED = json.dumps([{"State": {"Status": "exited", "ExitCode": 0}}])


class ScriptedPodman(podman_mod.Podman):
    """Answers each ``podman`` call with the next (rc, stdout, stderr) of ``answers``."""

    def __init__(self, answers: list[tuple[int, str, str]]):
        super().__init__(Path("/nonexistent"))
        self.answers, self.calls = list(answers), 0

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        assert args[:2] == ("container", "inspect") and not check
        self.calls += 1
        rc, out, err = self.answers.pop(0)
        return subprocess.CompletedProcess(["podman", *args], rc, out, err)


def test_inspect_reads_again_when_the_process_exited_while_podman_read_its_cgroup():
    podman = ScriptedPodman([(125, "", RACE), (0, EXITED, "")])
    assert podman.inspect("c")["State"] == {"Status": "exited", "ExitCode": 0}
    assert podman.calls == 2


def test_inspect_gives_up_after_its_tries():
    podman = ScriptedPodman([(125, "", RACE)] * podman_mod.INSPECT_TRIES)
    with pytest.raises(AssertionError, match="rc 125"):
        podman.inspect("c")
    assert podman.calls == podman_mod.INSPECT_TRIES


@pytest.mark.parametrize("err", ["Error: no such container c\n",
                                 "Error: read /proc/7699/status: no such process\n"])
def test_inspect_fails_at_once_on_any_other_error(err):
    podman = ScriptedPodman([(125, "", err), (0, EXITED, "")])
    with pytest.raises(AssertionError, match=err.strip().split(": ", 1)[1]):
        podman.inspect("c")
    assert podman.calls == 1

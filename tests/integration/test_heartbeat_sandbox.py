"""The .run's extraction in the build sandbox shows it is alive: ``still_running`` events
with the last line it wrote (read from the sandbox's output file, not from a pipe)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from installer.base.errors import BuildError
from installer.driver import nvidia_run
from installer.host.runner import Runner

pytestmark = pytest.mark.chroot

NAME = "NVIDIA-Linux-x86_64-550.54.14.run"
# makeself's variables (it passes the header check), then a slow "extraction" that fails.
SLOW_RUN = """#!/bin/sh
CRCsum="0"
label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
skip="1"
echo "Verifying archive integrity... All good."
sleep 1.5
echo "Uncompressing NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"
sleep 1.5
exit 1
"""


def test_a_slow_extraction_logs_heartbeats_with_its_last_line(tmp_path):
    run_file = tmp_path / "downloads" / NAME
    run_file.parent.mkdir()
    run_file.write_text(SLOW_RUN)
    (tmp_path / "staging").mkdir()
    with capture_logs() as logs, pytest.raises(BuildError, match=f"could not extract {NAME}"):
        nvidia_run.extract(Runner(heartbeat_s=0.5), run_file, tmp_path / "staging" / "extract")
    beats = [e for e in logs if e["event"] == "still_running"]
    assert {b["command"] for b in beats} == {f"{NAME} -x"}
    lines = [b.get("last_line") for b in beats]
    assert "Verifying archive integrity... All good." in lines
    assert lines[-1] == "Uncompressing NVIDIA Accelerated Graphics Driver for Linux-x86_64 550.54.14"

"""A long-running command logs that it is alive (issue 14): elapsed time and its last line."""

from __future__ import annotations

import time

import pytest
from structlog.testing import capture_logs

from installer.host.runner import CommandError, Runner
from tests.unit.test_signals import stop_group_on_sigterm

SCRIPT = "echo a; sleep 2; echo b >&2; sleep 2"


def _beats(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "still_running"]


def test_heartbeats_carry_the_elapsed_time_and_the_last_line():
    with capture_logs() as logs:
        result = Runner(heartbeat_s=0.5).run(["sh", "-c", SCRIPT], long_running="demo")
    beats = _beats(logs)
    assert len(beats) >= 6, beats  # ~4 s at 0.5 s (more on a loaded machine)
    assert {b["command"] for b in beats} == {"demo"}
    assert [b["elapsed_s"] for b in beats] == sorted(b["elapsed_s"] for b in beats)
    lines = [b.get("last_line") for b in beats]
    assert "a" in lines[:3] and lines[-1] == "b"
    assert (result.stdout, result.stderr, result.returncode) == ("a\n", "b\n", 0)


def test_a_short_command_and_an_unmarked_one_log_no_heartbeat():
    with capture_logs() as logs:
        Runner(heartbeat_s=0.5).run(["sh", "-c", "echo quick"], long_running="quick")
        Runner(heartbeat_s=0.5).run(["sh", "-c", "sleep 1.2"])
    assert _beats(logs) == []


def test_the_last_line_comes_from_the_newest_watched_file(tmp_path):
    log_file = tmp_path / "build.log"
    script = f"echo pipe-line; sleep 0.3; printf 'CC nv.o\\n  LD nvidia.ko\\n\\n' > {log_file}; sleep 1"
    with capture_logs() as logs:
        Runner(heartbeat_s=0.5).run(["sh", "-c", script], long_running="nvidia-installer",
                                    watch=[tmp_path / "missing.log", log_file])
    assert _beats(logs)[-1]["last_line"] == "LD nvidia.ko"


def test_large_output_does_not_deadlock_and_its_tail_is_kept():
    script = "i=0; while [ $i -lt 20000 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); done; exit 3"
    with pytest.raises(CommandError) as info:
        Runner(heartbeat_s=0.2).run(["sh", "-c", script], long_running="noisy", timeout=60)
    assert info.value.returncode == 3
    assert info.value.stdout.count("\n") == 20000
    assert info.value.stderr_tail(1) == "err-19999"


def test_a_timeout_stops_it_with_its_output_so_far():
    start = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 1s") as info:
        Runner(heartbeat_s=0.3).run(["sh", "-c", "echo started; sleep 30"],
                                    long_running="slow", timeout=1)
    assert time.monotonic() - start < 8
    assert info.value.stdout == "started\n"


def test_sigterm_still_stops_the_whole_group(tmp_path):
    """A heartbeat-watched command too: SIGTERM to the installer (a child here, never the
    test runner) ends its whole group."""
    stop_group_on_sigterm(tmp_path, "heartbeat_s=0.2", "long_running='build'")


def test_the_runner_carries_the_child_environment():
    """Issue 32 item 5: what every command must see (the kernel seams in tests) is the
    Runner's, not an argument threaded through each call; a call's own env adds to it."""
    runner = Runner(env={"NDI_SEAM": "runner", "NDI_BOTH": "runner"})
    out = runner.run(["sh", "-c", 'echo "$NDI_SEAM $NDI_BOTH $NDI_CALL"'],
                     env={"NDI_BOTH": "call", "NDI_CALL": "call"}).stdout
    assert out.split() == ["runner", "call", "call"]
    assert Runner().run(["sh", "-c", 'echo "${NDI_SEAM:-unset}"']).stdout.strip() == "unset"

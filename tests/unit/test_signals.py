"""installer.signals and the Runner's process groups: SIGTERM/SIGINT stop everything cleanly."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from installer import signals
from installer.runner import CommandError, Runner


def _kill_self_soon(sig: int, after: float = 0.3) -> None:
    threading.Timer(after, os.kill, (os.getpid(), sig)).start()


def test_sigterm_raises_interrupted_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signals.Interrupted) as err, signals.handled():
        _kill_self_soon(signal.SIGTERM, 0.05)
        time.sleep(5)
    assert err.value.exit_code == 143 and err.value.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_deferred_block_finishes_before_the_signal_acts():
    done = []
    with pytest.raises(signals.Interrupted) as err, signals.handled(), signals.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        done.append("swap finished")
    assert done == ["swap finished"] and err.value.exit_code == 130


def test_runner_stops_the_whole_process_group(tmp_path):
    """A command's own children die with it: on SIGTERM to us, and on a timeout."""
    marker = tmp_path / "grandchild"
    script = f"sleep 30 & echo $! > {marker}; wait"
    with pytest.raises(signals.Interrupted), signals.handled():
        _kill_self_soon(signal.SIGTERM)
        Runner().run(["sh", "-c", script], timeout=60)
    pid = int(marker.read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone (or a zombie)

    start = time.monotonic()
    with pytest.raises(CommandError, match="timed out"):
        Runner().run(["sh", "-c", script], timeout=0.5)
    assert time.monotonic() - start < 10

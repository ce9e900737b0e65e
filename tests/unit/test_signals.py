"""installer.base.signals and the Runner's process groups: SIGTERM/SIGINT stop everything cleanly.

The signals go to a child Python running the code under test (``in_child``), never to the
test runner: a signal that lands after a handler is restored would stop the whole run.
Waits poll against deadlines, so a loaded machine makes them slower, not wrong.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from installer.host.runner import CommandError, Runner

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30


def in_child(body: str) -> subprocess.Popen[str]:
    """A Python child running ``body`` (indented into a function ``main``) with the
    installer's signal handlers; it prints ``exit <code> <name>`` when Interrupted."""
    code = ("import os, signal, sys, time\n"
            "from installer.base import signals\n"
            "from installer.host.runner import Runner\n"
            "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n"
            "try:\n"
            "    main()\n"
            "except signals.Interrupted as exc:\n"
            "    print('exit', exc.exit_code, exc.name, flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(what: str, ready, proc: subprocess.Popen[str] | None = None,
             deadline_s: float = DEADLINE_S):
    """Poll ``ready()`` until it is true or the deadline passes (then fail, naming ``what``)."""
    end = time.monotonic() + deadline_s
    while not (got := ready()):
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the child exited {proc.returncode} before {what}: {proc.stderr.read()}")
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {deadline_s} s")
        time.sleep(0.05)
    return got


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The child's exit status and stdout (it is killed if it outlives the deadline)."""
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child did not stop within {DEADLINE_S} s: {err}")
    return proc.returncode, out + err


def gone_or_zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def stop_group_on_sigterm(tmp_path: Path, runner_args: str = "", run_args: str = "") -> None:
    """SIGTERM to a child running ``Runner(runner_args).run(sh: sleep & wait, run_args)`` under the
    handlers: it exits 143 and the sh's own child (the grandchild) goes with it."""
    marker = tmp_path / "grandchild"
    script = f"sleep 300 & echo $! > {marker}.tmp; mv {marker}.tmp {marker}; wait"
    proc = in_child(f"""
        with signals.handled():
            Runner({runner_args}).run(["sh", "-c", {script!r}], timeout=600, {run_args})
    """)
    try:
        wait_for("grandchild started", marker.exists, proc)
        pid = int(marker.read_text())
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
        assert (code, out.splitlines()[-1:]) == (0, ["exit 143 SIGTERM"]), out
        wait_for(f"end of the grandchild {pid}", lambda: gone_or_zombie(pid))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_raises_interrupted_and_the_handlers_are_restored():
    proc = in_child("""
        before = signal.getsignal(signal.SIGTERM)
        try:
            with signals.handled():
                print("ready", flush=True)
                time.sleep(300)
        finally:
            print("restored", signal.getsignal(signal.SIGTERM) is before, flush=True)
    """)
    try:
        assert proc.stdout.readline() == "ready\n"  # the child sleeps at most 300 s
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0 and out.splitlines()[:2] == ["restored True", "exit 143 SIGTERM"], out


def test_a_deferred_block_finishes_before_the_signal_acts():
    proc = in_child("""
        with signals.handled(), signals.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            print("swap finished", flush=True)
    """)
    code, out = finish(proc)
    assert code == 0 and out.splitlines()[:2] == ["swap finished", "exit 130 SIGINT"], out


def test_runner_stops_the_whole_process_group(tmp_path):
    """A command's own children die with it: on SIGTERM to us, and on a timeout."""
    stop_group_on_sigterm(tmp_path)

    script = "sleep 30 & wait"
    start = time.monotonic()
    with pytest.raises(CommandError, match="timed out"):
        Runner().run(["sh", "-c", script], timeout=0.5)
    assert time.monotonic() - start < 10

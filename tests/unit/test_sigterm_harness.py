"""SIGTERM to a test run leaves no pod behind (issue 34 §5): `make test` stopped by SIGTERM
used to leave `unshare … python -m installer install` running, orphaned. A pytest run of
one test waiting on an unshare'd child, as tests/pod.py runs the installer, is sent SIGTERM;
afterwards no process of that pod may remain."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.chroot  # root and unshare(1), as the pods


def _with_marker(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_sigterm_to_pytest_kills_the_pod_it_waits_for(tmp_path):
    marker = f"ndi-orphan-check-{uuid.uuid4().hex}"
    started = tmp_path / "started"
    (tmp_path / "test_pod_waits.py").write_text(f"""
import subprocess
def test_waits():
    subprocess.run(["unshare", "--mount", "--pid", "--fork", "--kill-child", "--", "sh", "-c",
                    "touch {started}; exec sleep 300 # {marker}"], timeout=600)
""")
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-p", "tests.fixtures.pytest_plugin", str(tmp_path)],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.1)
        assert _with_marker(marker)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _with_marker(marker) == [], "the pod outlived the stopped test run"
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)

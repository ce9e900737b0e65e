"""Code run in a fresh interpreter from the repository's root: for what changes a process
for good (sys.modules, the garbage collector's frozen objects)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stdout_of(code: str) -> str:
    """``python -c code``'s stdout, stripped; the test fails with its stderr if it fails."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()

"""`make help` lists every target with its ``##`` comment (issue 14)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_lists_every_phony_target_with_its_comment():
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY: (.+)$", makefile, re.M).group(1).split()
    proc = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    listed = {ln.split()[0]: ln.split(None, 1)[1] for ln in proc.stdout.splitlines()}
    assert sorted(listed) == sorted(phony)
    assert listed["demo"].startswith("a real install against a built-in fixture node")
    assert listed["help"] == "list the targets"

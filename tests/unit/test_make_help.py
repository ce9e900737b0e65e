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


def test_make_deps_installs_every_debian_package_a_default_test_names():
    """Issue 26: a default-run test that skips for a missing tool ("Debian package X") means
    `make deps` forgot X."""
    script = (ROOT / "scripts/install-deps.sh").read_text()
    default = set(re.search(r"default=1; pkgs=\(([^)]*)\)", script).group(1).split())
    tiers = [ROOT / "tests" / d for d in ("unit", "integration", "attacks", "fixtures")]
    named = {m.group(1) for tier in tiers for path in tier.rglob("*.py")
             for m in re.finditer(r"\(Debian package ([a-z0-9.+-]+)\)", path.read_text())}
    assert "shellcheck" in named  # the pattern still finds what it is for
    assert named <= default, f"missing from make deps: {sorted(named - default)}"


def test_the_release_workflow_runs_what_make_images_and_make_push_run():
    """Not run here (a public CI's): at least it parses, calls our scripts, and may sign."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    runs = "\n".join(s.get("run", "") for s in workflow["jobs"]["images"]["steps"])
    for script in ("images/build.sh", "images/push.sh"):
        assert script in runs and (ROOT / script).is_file()
    assert "NDI_LOCAL_BASE" not in runs  # the real bases, never the test substitute
    assert workflow["permissions"]["id-token"] == "write" and "cosign sign" in runs


@pytest.mark.parametrize("script", ["images/push.sh", "images/common.sh"])
def test_image_scripts_shellcheck(script):
    """images/build.sh is checked in test_manifests; the scripts it shares code with, here."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian package shellcheck)")
    proc = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr

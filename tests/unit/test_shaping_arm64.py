"""The cache key of the tier's cross builds (``bundle build --arch arm64``) holds every
installer file whose code decides what such a build produces (tests/arm64/shaping.py says
which and why), and no other: a module that shapes the build and is left out of the list
fails here. The checks are tests/shapingcheck.py's, as for tests/realparts' builds.
Nothing here needs the arm64 parts or the guest."""

from __future__ import annotations

from pathlib import Path

from tests import shapingcheck
from tests.arm64 import bundle_cross, shaping
from tests.arm64.shaping import BUILD, ENTRY, NOT_FOLLOWED, REPO, STEP_FUNCTIONS

WHERE = "tests/arm64/shaping.py SHAPING"


def test_every_listed_file_exists_and_is_python():
    assert not shapingcheck.missing_files(BUILD), f"listed in {WHERE} but not there"
    assert all(rel.suffix == ".py" for rel in shaping.files())
    assert set(STEP_FUNCTIONS) <= {str(rel) for rel in shaping.files()}


def test_every_function_the_command_reaches_is_followed():
    """From ``bundle build``'s command function, through the step files' functions: each
    one reached is followed (STEP_FUNCTIONS) or says why not (NOT_FOLLOWED)."""
    reached = shapingcheck.reached_step_functions(BUILD, ENTRY) - {ENTRY}
    followed = {(rel, fn) for rel, fns in STEP_FUNCTIONS.items() for fn in fns}
    unfollowed = sorted(reached - followed - set(NOT_FOLLOWED))
    assert not unfollowed, f"reached from {ENTRY} but not in STEP_FUNCTIONS: {unfollowed}"
    assert set(NOT_FOLLOWED) <= reached, "NOT_FOLLOWED names a function no longer reached"
    assert ("installer/commands/bundle_build.py", "plan") in reached


def test_the_list_is_closed_under_imports():
    """Whatever a listed module imports (its functions' imports included) decides the
    build as much as the module itself; step files count through their functions only."""
    missing = shapingcheck.unlisted_imports(BUILD)
    assert not missing, (f"installer modules that shape the arm64 bundle but are not in "
                         f"{WHERE}: {missing} (file: the listed files importing it)")


def test_the_build_steps_use_only_listed_modules():
    found = shapingcheck.unlisted_step_uses(BUILD)
    assert not found, f"{found}: not in {WHERE} (or DATA_ONLY, if it only carries a value)"


def test_modules_run_by_name_are_listed():
    """``python -m installer.jail.run_in_jail``: a module started by name, not imported."""
    found = shapingcheck.unlisted_run_by_name(BUILD)
    assert not found, f"{found}: not in {WHERE}"


def test_the_key_follows_listed_files_only(tmp_path: Path):
    shapingcheck.copy_with(BUILD, tmp_path, Path("installer/detect.py"))
    before = shaping.source_hash(tmp_path)
    shapingcheck.edit(tmp_path, "installer/detect.py")  # not the build's: same key
    assert shaping.source_hash(tmp_path) == before
    for rel in ("installer/jail/run_in_jail.py", "installer/driver/nvidia_run.py"):
        shapingcheck.edit(tmp_path, rel)
        after = shaping.source_hash(tmp_path)
        assert after != before, rel
        before = after
    assert shaping.source_hash() == shaping.source_hash(REPO)


def test_the_bundles_key_is_this_list():
    assert bundle_cross.shaping_key is shaping.source_hash

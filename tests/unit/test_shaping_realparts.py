"""The cache key of the builds through the installer holds every installer file whose code
decides what such a build produces (tests/realparts/shaping.py says which and why), and no
other: a module that shapes the build and is left out of the list fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import shapingcheck
from tests.realparts import shaping
from tests.realparts.shaping import BUILD, REPO

# Event names and .cache fields the tier's tests read from a cached build.
READ_BACK = ("kernel_modules_build_started", "nvidia_installer_started",
             "CACHE_NVIDIA_DRIVER_VERSION", "CACHE_KERNEL_VERSION")


def test_every_listed_file_exists_and_is_python():
    assert not shapingcheck.missing_files(BUILD), "listed in shaping.SHAPING but not there"
    assert all(rel.suffix == ".py" for rel in shaping.files())


def test_the_list_is_closed_under_imports():
    """Whatever a listed module imports (its functions' imports included: the project's
    import graph, tests/importgraph.py) decides the build as much as the module itself.
    The step files are followed only through the build's own functions (next test)."""
    missing = shapingcheck.unlisted_imports(BUILD)
    assert not missing, ("installer modules that shape the build through the installer but "
                         f"are not in tests/realparts/shaping.py SHAPING: {missing} "
                         "(file: the listed files importing it)")


def test_the_build_steps_use_only_listed_modules():
    found = shapingcheck.unlisted_step_uses(BUILD)
    assert not found, (f"{found}: not in tests/realparts/shaping.py SHAPING (or DATA_ONLY, "
                       "if it only carries a value)")


def test_modules_run_by_name_are_listed():
    """``python -m installer.jail.run_in_jail``: a module started by name, not imported."""
    found = shapingcheck.unlisted_run_by_name(BUILD)
    assert not found, f"{found}: not in tests/realparts/shaping.py SHAPING"


def _code_strings(path: Path) -> str:
    """The file's string literals, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and id(n) not in docs)


def test_what_the_tests_read_back_is_written_by_listed_files():
    """The events and .cache fields the tier's tests assert on, in a cached build: every
    installer file that writes one is in the key."""
    listed = set(shaping.files())
    strings = {p.relative_to(REPO): _code_strings(p)
               for p in sorted((REPO / "installer").rglob("*.py"))}
    for word in READ_BACK:
        writers = [rel for rel, text in strings.items() if word in text]
        assert writers, word
        assert set(writers) <= listed, (word, [str(w) for w in writers if w not in listed])
    assert Path("installer/exits.py") in listed  # install_failed: f"{command}_failed"


def test_the_key_follows_listed_files_only(tmp_path: Path):
    shapingcheck.copy_with(BUILD, tmp_path, Path("installer/detect.py"))
    before = shaping.source_hash(tmp_path)
    shapingcheck.edit(tmp_path, "installer/detect.py")  # not a build's: same key
    assert shaping.source_hash(tmp_path) == before
    shapingcheck.edit(tmp_path, "installer/driver/module_build.py")
    assert shaping.source_hash(tmp_path) != before
    assert shaping.source_hash() == shaping.source_hash(REPO)

"""The cache key of the builds through the installer holds every installer file whose code
decides what such a build produces (tests/realparts/shaping.py says which and why), and no
other: a module that shapes the build and is left out of the list fails here."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tests import importgraph
from tests.realparts import shaping
from tests.realparts.shaping import DATA_ONLY, REPO, STEP_FUNCTIONS

# Event names and .cache fields the tier's tests read from a cached build.
READ_BACK = ("kernel_modules_build_started", "nvidia_installer_started",
             "CACHE_NVIDIA_DRIVER_VERSION", "CACHE_KERNEL_VERSION")


def module_file(name: str) -> Path | None:
    """installer.x.y -> installer/x/y.py (or its package's __init__.py), relative to REPO."""
    for rel in (Path(*name.split(".")).with_suffix(".py"), Path(*name.split("."), "__init__.py")):
        if (REPO / rel).is_file():
            return rel
    return None


def _imported(node: ast.Import | ast.ImportFrom, rel: Path) -> dict[str, str]:
    """{bound name: installer module it comes from} of one import statement."""
    bound: dict[str, str] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "installer":
                bound[alias.asname or alias.name.split(".")[0]] = alias.name
        return bound
    base = node.module or ""
    if node.level:  # relative: from the file's package upwards
        package = list(rel.with_suffix("").parts[:-1])
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "installer":
        return bound
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        bound[alias.asname or alias.name] = sub if module_file(sub) else base
    return bound


def imports(rel: Path) -> dict[str, str]:
    """Every installer import in the file, at any depth (a function's own imports too)."""
    bound: dict[str, str] = {}
    for node in ast.walk(ast.parse((REPO / rel).read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(_imported(node, rel))
    return bound


def names_used(rel: Path, function: str) -> set[str]:
    tree = ast.parse((REPO / rel).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}


def test_every_listed_file_exists_and_is_python():
    for rel in shaping.SHAPING:
        assert (REPO / rel).exists(), f"{rel} is listed in shaping.SHAPING but does not exist"
    assert all(rel.suffix == ".py" for rel in shaping.files())


def test_the_list_is_closed_under_imports():
    """Whatever a listed module imports (its functions' imports included: the project's
    import graph, tests/importgraph.py) decides the build as much as the module itself.
    The step files are followed only through the build's own functions (next test)."""
    files = importgraph.module_files()
    listed = set(shaping.files())
    missing: dict[str, list[str]] = {}
    for edge in importgraph.imports(files):
        importer = files[edge.importer].relative_to(REPO)
        if importer not in listed or str(importer) in STEP_FUNCTIONS:
            continue
        dep = files[edge.imported].relative_to(REPO)
        if dep not in listed:
            missing.setdefault(str(dep), []).append(str(importer))
    assert not missing, ("installer modules that shape the build through the installer but "
                         f"are not in tests/realparts/shaping.py SHAPING: {missing} "
                         "(file: the listed files importing it)")


def test_the_build_steps_use_only_listed_modules():
    listed = set(shaping.files())
    for rel, functions in STEP_FUNCTIONS.items():
        bound = imports(Path(rel))
        for function in functions:
            for name in names_used(Path(rel), function) & set(bound) - DATA_ONLY:
                dep = module_file(bound[name])
                assert dep is None or dep in listed, (
                    f"{rel} {function}() uses {name} from {bound[name]}, which is not in "
                    "tests/realparts/shaping.py SHAPING (or DATA_ONLY, if it only carries a value)")


def test_modules_run_by_name_are_listed():
    """``python -m installer.jail.run_in_jail``: a module started by name, not imported."""
    listed = set(shaping.files())
    for rel in listed:
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("installer."):
                dep = module_file(node.value)
                assert dep is None or dep in listed, f"{rel} runs {node.value}: not listed"


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
    for rel in [*shaping.files(), Path("installer/detect.py")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    before = shaping.source_hash(tmp_path)
    with open(tmp_path / "installer/detect.py", "a") as f:  # not a build's: same key
        f.write("\n# changed\n")
    assert shaping.source_hash(tmp_path) == before
    with open(tmp_path / "installer/driver/module_build.py", "a") as f:
        f.write("\n# changed\n")
    assert shaping.source_hash(tmp_path) != before
    assert shaping.source_hash() == shaping.source_hash(REPO)

"""The checks behind a build cache's list of shaping installer files.

A slow tier that caches a build by content keys it on the installer files that decide
what the build produces, not on the whole installer/ (tests/realparts/shaping.py for the
builds through the installer, tests/arm64/shaping.py for ``bundle build --arch arm64``).
A list is right when nothing that shapes the build is left out of it; these helpers say
what is, read from the source (the AST, nothing imported). Each tier's tests/unit/test_shaping_*.py
calls them with its own list.

A ``Shaping`` names files (a directory stands for every .py under it), the step files
followed only through some of their functions (``step_functions``: the file's other
functions are not the build's), and the names those functions use that only carry values
(``data_only``).
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests import importgraph

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shaping:
    listed: tuple[str, ...]
    step_functions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    data_only: frozenset[str] = frozenset()

    def files(self, root: Path = REPO) -> list[Path]:
        """Every file the list names, relative to ``root``, sorted."""
        out: set[Path] = set()
        for rel in self.listed:
            path = root / rel
            found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
            out.update(p.relative_to(root) for p in found if "__pycache__" not in p.parts)
        return sorted(out)

    def source_hash(self, kind: str, root: Path = REPO) -> str:
        """The key of the installer's part in a build: each listed file's path and content
        (``kind`` keeps two tiers' keys apart)."""
        from tests.realparts import cache

        return cache.key(kind, [(str(rel), cache.file_hash(root / rel))
                                for rel in self.files(root)])


def copy_with(shaping: Shaping, dest: Path, *extra: Path) -> None:
    """The listed files and ``extra`` (unlisted ones) copied under ``dest``, laid out as in
    the repository: a tree whose files a key test may edit."""
    for rel in [*shaping.files(), *extra]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


def edit(root: Path, rel: str) -> None:
    """A change to ``root/rel`` that changes its bytes and nothing else."""
    with open(root / rel, "a") as f:
        f.write("\n# changed\n")


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
    """The names a top-level function (or ``Class.method``) of the file uses."""
    body: list[ast.stmt] = ast.parse((REPO / rel).read_text()).body
    *owners, name = function.split(".")
    for owner in owners:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}


def missing_files(shaping: Shaping) -> list[str]:
    return [rel for rel in shaping.listed if not (REPO / rel).exists()]


def unlisted_imports(shaping: Shaping) -> dict[str, list[str]]:
    """{unlisted module file: the listed files importing it} (a function's imports and
    type-only ones too: tests/importgraph.py); step files count only through their
    functions (``unlisted_step_uses``)."""
    files = importgraph.module_files()
    listed = set(shaping.files())
    missing: dict[str, list[str]] = {}
    for edge in importgraph.imports(files):
        importer = files[edge.importer].relative_to(REPO)
        if importer not in listed or str(importer) in shaping.step_functions:
            continue
        dep = files[edge.imported].relative_to(REPO)
        if dep not in listed:
            missing.setdefault(str(dep), []).append(str(importer))
    return missing


def unlisted_step_uses(shaping: Shaping) -> list[str]:
    """Each name a step function uses from an unlisted module (and not data only)."""
    listed = set(shaping.files())
    found: list[str] = []
    for rel, functions in shaping.step_functions.items():
        bound = imports(Path(rel))
        for function in functions:
            for name in sorted(names_used(Path(rel), function) & set(bound) - shaping.data_only):
                dep = module_file(bound[name])
                if dep is not None and dep not in listed:
                    found.append(f"{rel} {function}() uses {name} from {bound[name]}")
    return found


def unlisted_run_by_name(shaping: Shaping) -> list[str]:
    """``python -m installer.jail.run_in_jail``: a module started by name, not imported."""
    listed = set(shaping.files())
    found: list[str] = []
    for rel in sorted(listed):
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("installer."):
                dep = module_file(node.value)
                if dep is not None and dep not in listed:
                    found.append(f"{rel} runs {node.value}")
    return found


def _calls(rel: Path, function: str) -> set[tuple[str, str]]:
    """(file, function) of each top-level function the function names: its own file's by
    name, another installer module's as ``module.function`` or an imported name."""
    tree = ast.parse((REPO / rel).read_text())
    local = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    bound = imports(rel)
    *owners, name = function.split(".")
    body: list[ast.stmt] = tree.body
    for owner in owners:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    found: set[tuple[str, str]] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in local:
            found.add((str(rel), node.id))
        elif isinstance(node, ast.Name) and node.id in bound:
            dep = module_file(bound[node.id])
            if dep is not None:
                found.add((str(dep), node.id))  # from installer.x import function
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            dep = module_file(bound[node.value.id])
            if dep is not None:
                found.add((str(dep), node.attr))  # module.function
    return found


def reached_step_functions(shaping: Shaping, entry: tuple[str, str]) -> set[tuple[str, str]]:
    """The (step file, function) pairs reached from ``entry`` through the step files'
    functions (names in ``data_only`` are not followed)."""
    seen: set[tuple[str, str]] = set()
    todo = [entry]
    while todo:
        rel, function = todo.pop()
        if (rel, function) in seen:
            continue
        seen.add((rel, function))
        for dep_rel, dep_fn in _calls(Path(rel), function):
            top = {n.name for n in ast.parse((REPO / dep_rel).read_text()).body
                   if isinstance(n, ast.FunctionDef)}
            if dep_rel in shaping.step_functions and dep_fn in top \
                    and dep_fn not in shaping.data_only:
                todo.append((dep_rel, dep_fn))
    return seen

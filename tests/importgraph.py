"""The structure of installer/ drawn from its source: which module imports which.

Read from the AST, not by importing anything, so type-only imports (under
``if TYPE_CHECKING:``) and imports inside functions count like the rest: a circle
through a type-only import is still a circle a reader has to hold in their head.

``python -m tests.importgraph`` prints the figures tests/unit/test_import_graph.py
holds to (circles, upward imports, function-level imports, long modules and functions).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "installer"

# Where an import inside a function is the point: the commands keep their heavy imports
# out of ``--help`` and of the commands that do not need them.
CLI_STARTUP = re.compile(r"^installer(\.__main__|(\..+)?\.cli|\..+_cli)$")
# Elsewhere, the only imports inside a function: each defers a library that only some runs
# use, so that a cache hit (every boot) loads none of them (docs/performance.md,
# tests/integration/test_startup_imports.py). module -> what it imports there; each site
# says why in a comment.
DEFERRED_IMPORTS: dict[str, frozenset[str]] = {
    # requests, through the session module, with the first request
    "installer.context": frozenset({"installer.net.session"}),
    "installer.distros.cos.artifacts": frozenset({"installer.net.session"}),
    "installer.net.fetch": frozenset({"installer.net.session"}),
    "installer.net.transfer": frozenset({"installer.net.session"}),
    # requests' and urllib3's error classes, and tenacity, with the first retried request
    "installer.net.retry": frozenset({"requests", "urllib3.exceptions", "tenacity",
                                      "email.utils", "ssl"}),
    # libseccomp (ctypes; find_library runs ldconfig) when a jail starts
    "installer.jail.seccomp": frozenset({"pyseccomp"}),
    # the zstd binding for the first zstd archive (a bundle)
    "installer.jail.tarstream": frozenset({"zstandard"}),
    # the fabric manager's fetch, only on a node with an NVLink fabric
    "installer.steps.fabric": frozenset({"installer.services.fabricmanager"}),
    # the download, .run and build modules, only for a plan that downloads and builds
    "installer.steps.staging": frozenset({
        "installer.net.transfer", "installer.net.parallel", "installer.driver.nvidia_run",
        "installer.driver.module_build",
        "installer.jail.cgroup_memory", "installer.jail.cpus"}),
    # OpenSSL's hashes, with the first file hashed (a cache hit checks by stat); ctypes
    # (libc's renameat2) only to promote a staged install; shutil (bz2, lzma and zlib with
    # it) only for a directory tree to remove. Neither click nor structlog imports ctypes
    # or shutil, and a cache hit needs neither (docs/performance.md).
    "installer.base.fsutil": frozenset({"hashlib", "ctypes", "shutil"}),
    # ctypes in the CUDA probe's own process; the installer imports it for its file name
    "installer.services.cuda_probe": frozenset({"ctypes"}),
    # shutil: a terminal width neither stream reports
    "installer.log": frozenset({"shutil"}),
    # the bundle index and fetch, only for a run given a bundle URL (--prebuilt-url);
    # shutil.which("apt-get"), only on a node whose headers are not there
    "installer.distros.headers_build_flow": frozenset({"installer.bundle.fetch", "shutil"}),
    # a distro's flow, only for a host of that flow (an Ubuntu boot loads none of COS's)
    "installer.distros.flows": frozenset({"installer.distros.cos.flow",
                                          "installer.distros.headers_build_flow"}),
}
# The comment an import running up the layers carries, on its line or the line above.
UPWARD_REASON = re.compile(r"#\s*upward:\s*\S")

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_UPWARD = 5


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    type_only: bool
    in_function: bool
    reason: bool  # an ``# upward: why`` comment on the line or the one above


@dataclass(frozen=True)
class Function:
    module: str
    name: str
    line: int
    lines: int


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, type_only: bool = False,
          in_function: bool = False) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node with whether it sits under ``if TYPE_CHECKING`` / inside a function."""
    for child in ast.iter_child_nodes(node):
        yield child, type_only, in_function
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield sub, True, in_function
                yield from _walk(sub, True, in_function)
            for sub in child.orelse:
                yield sub, type_only, in_function
                yield from _walk(sub, type_only, in_function)
            continue
        yield from _walk(child, type_only, in_function or isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                yield alias.name
        return
    if node.level:
        base_parts = module.split(".") if is_package else module.split(".")[:-1]
        base_parts = base_parts[:len(base_parts) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}"
        elif base in modules:
            yield base


def imports(files: dict[str, Path] | None = None) -> list[Import]:
    """Every import of one installer module by another (each target once per statement)."""
    files = files if files is not None else module_files()
    names = set(files)
    found: list[Import] = []
    for module, path in files.items():
        source = path.read_text()
        lines = source.splitlines()
        for node, type_only, in_function in _walk(ast.parse(source, str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            around = lines[node.lineno - 2:node.end_lineno] if node.lineno > 1 else lines[:node.end_lineno]
            reason = any(UPWARD_REASON.search(text) for text in around)
            for target in dict.fromkeys(_targets(node, module, path.name == "__init__.py", names)):
                if target != module:
                    found.append(Import(module, target, node.lineno, type_only, in_function, reason))
    return found


def _imported_names(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    return {node.module or ""}


def deferred_imports(files: dict[str, Path] | None = None) -> list[tuple[str, int, str]]:
    """(module, line, imported name) of every import statement inside a function (of any
    module: stdlib and libraries too), outside the CLI's start-up path."""
    files = files if files is not None else module_files()
    return [(module, node.lineno, name)
            for module, path in files.items() if not CLI_STARTUP.match(module)
            for node, _, in_function in _walk(ast.parse(path.read_text(), str(path)))
            if in_function and isinstance(node, ast.Import | ast.ImportFrom)
            for name in sorted(_imported_names(node))]


def function_level_imports(files: dict[str, Path] | None = None) -> list[tuple[str, int]]:
    """Imports inside a function outside the CLI's start-up path and DEFERRED_IMPORTS."""
    return [(module, line) for module, line, name in deferred_imports(files)
            if name not in DEFERRED_IMPORTS.get(module, frozenset())]


def circles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layers(pyproject: Path = REPO / "pyproject.toml") -> list[list[str]]:
    """The import-linter layers contract, top layer first, each a list of its modules."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def layer_of(module: str, contract: list[list[str]]) -> int | None:
    """The index of the layer naming the module or its nearest enclosing package."""
    best: tuple[int, int] | None = None  # (depth of the named module, layer)
    for position, layer in enumerate(contract):
        for name in layer:
            if module == name or module.startswith(name + "."):
                depth = name.count(".")
                if best is None or depth > best[0]:
                    best = (depth, position)
    return None if best is None else best[1]


def upward(edges: list[Import], contract: list[list[str]]) -> list[Import]:
    """Imports from a lower layer into a higher one (the top layer is first)."""
    found = []
    for edge in edges:
        low, high = layer_of(edge.importer, contract), layer_of(edge.imported, contract)
        if low is not None and high is not None and high < low:
            found.append(edge)
    return found


def unlayered(files: dict[str, Path], contract: list[list[str]]) -> list[str]:
    """Modules no layer names, by themselves or through a package. A package whose
    ``__init__`` holds only its docstring (its modules are named one by one, in the
    layers they belong to) has nothing to place."""
    return [m for m, path in files.items()
            if m != PACKAGE and layer_of(m, contract) is None and not _docstring_only(path)]


def _docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def long_functions(files: dict[str, Path] | None = None,
                   limit: int = MAX_FUNCTION_LINES) -> list[Function]:
    """Functions (methods, nested ones) whose ``def`` to last line spans over ``limit``."""
    files = files if files is not None else module_files()
    found = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(Function(module, node.name, node.lineno, lines))
    return found


def long_modules(files: dict[str, Path] | None = None,
                 limit: int = MAX_MODULE_LINES) -> list[tuple[str, int]]:
    files = files if files is not None else module_files()
    sizes = ((m, len(p.read_text().splitlines())) for m, p in files.items())
    return [(m, n) for m, n in sizes if n > limit]


def report() -> str:
    files = module_files()
    edges = imports(files)
    contract = layers()
    rings = circles(edges)
    ups = upward(edges, contract)
    in_functions = function_level_imports(files)
    out = [f"modules: {len(files)}, imports between them: {len(edges)}"]
    out.append(f"circles: {len(rings)} " + " ".join(f"[{len(r)}: {', '.join(r)}]" for r in rings))
    out.append(f"upward imports (layers contract): {len(ups)} (<= {MAX_UPWARD}), "
               f"{sum(not e.reason for e in ups)} without an '# upward: why' comment")
    out += [f"  {e.importer}:{e.line} -> {e.imported}" for e in ups]
    out.append(f"modules outside the layers contract: {len(unlayered(files, contract))}")
    out.append(f"function-level imports outside the CLI start-up path: {len(in_functions)}")
    out += [f"  {module}:{line}" for module, line in in_functions]
    out.append(f"modules over {MAX_MODULE_LINES} lines: "
               + ", ".join(f"{m} {n}" for m, n in long_modules(files)))
    functions = long_functions(files)
    out.append(f"functions over {MAX_FUNCTION_LINES} lines: {len(functions)}")
    out += [f"  {f.module}:{f.line} {f.name} {f.lines}" for f in functions]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")

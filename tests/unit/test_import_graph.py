"""The shape of installer/ (issue 32): imports lean one way, modules and functions stay short.

The graph is drawn from the AST (tests/importgraph.py), type-only imports and imports
inside functions included; ``python -m tests.importgraph`` prints the current figures.
"""

from __future__ import annotations

import pytest

from tests import importgraph as graph


@pytest.fixture(scope="module")
def files():
    return graph.module_files()


@pytest.fixture(scope="module")
def edges(files):
    return graph.imports(files)


def test_the_graph_sees_type_only_and_function_level_imports(tmp_path):
    """The tool itself: an import under TYPE_CHECKING and one inside a function are edges,
    and a circle through them is found."""
    pkg = tmp_path / "installer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from installer.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from installer import c\n")
    (pkg / "c.py").write_text("from . import a  # upward: a test\n")
    found = graph.imports(graph.module_files(tmp_path))
    assert {(e.importer, e.imported, e.type_only, e.in_function) for e in found} == {
        ("installer.a", "installer.b", True, False),
        ("installer.b", "installer.c", False, True),
        ("installer.c", "installer.a", False, False),
    }
    assert graph.circles(found) == [["installer.a", "installer.b", "installer.c"]]
    assert [e.reason for e in found if e.importer == "installer.c"] == [True]


def test_no_import_circle(edges):
    assert graph.circles(edges) == []


def test_few_upward_imports_each_with_its_reason(edges):
    ups = graph.upward(edges, graph.layers())
    assert len(ups) <= graph.MAX_UPWARD, [f"{e.importer}:{e.line} -> {e.imported}" for e in ups]
    assert [f"{e.importer}:{e.line}" for e in ups if not e.reason] == []


def test_the_layers_contract_names_every_module(files):
    assert graph.unlayered(files, graph.layers()) == []


def test_no_function_level_import_outside_the_cli_start_up_and_the_deferred_list(files):
    assert graph.function_level_imports(files) == []


def test_every_deferred_import_is_used_and_says_why(files):
    """graph.DEFERRED_IMPORTS names no import that is gone (the list stays the truth), and
    each deferred import has a comment within the three lines above it or on its line."""
    used = {(module, name) for module, _, name in graph.deferred_imports(files)}
    listed = {(module, name) for module, names in graph.DEFERRED_IMPORTS.items() for name in names}
    assert sorted(listed - used) == []
    for module, line, name in graph.deferred_imports(files):
        if name not in graph.DEFERRED_IMPORTS.get(module, frozenset()):
            continue
        lines = files[module].read_text().splitlines()[max(0, line - 4):line]
        assert any("#" in text for text in lines), f"{module}:{line} imports {name}: say why"


def test_no_module_over_500_lines(files):
    assert graph.long_modules(files) == []


def test_no_function_over_60_lines(files):
    assert [f"{f.module}:{f.line} {f.name} ({f.lines} lines)"
            for f in graph.long_functions(files)] == []


def test_the_lazy_commands_are_edges_the_layering_check_sees(edges, files):
    """cli loads some commands only when one runs (start-up time), through imports inside
    functions, which the layers contract and this graph count; never a module name in a
    string (importlib), which no checker sees."""
    source = files["installer.cli"].read_text()
    assert "import_module" not in source and "__import__" not in source
    from_cli = {e.imported for e in edges if e.importer == "installer.cli"}
    for command in ("installer.commands.sidecar_cli", "installer.commands.bundle_cli",
                    "installer.commands.manifests.cli"):
        assert command in from_cli, command


def test_the_lazily_loaded_flows_are_edges_the_layering_check_sees(edges, files):
    """distros.flows imports each flow only for a host of that flow (a cache hit loads its
    own flow only), inside a loader function, never through a module name in a string: the
    layers contract and this graph see an edge to every flow FLOWS names."""
    from installer.distros.flows import FLOWS

    source = files["installer.distros.flows"].read_text()
    assert "import_module" not in source and "__import__" not in source
    from_flows = {e.imported for e in edges if e.importer == "installer.distros.flows"}
    loaded = {load().__module__ for load in FLOWS.values()}
    assert loaded == {"installer.distros.cos.flow", "installer.distros.headers_build_flow"}
    assert loaded <= from_flows, sorted(loaded - from_flows)


def test_the_packages_form_no_circle(edges):
    """installer/'s folders carry the layers: taken as units (a package, or a top-level
    module), nothing imports back up."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    between = [graph.Import(unit(e.importer), unit(e.imported), e.line, e.type_only, e.in_function,
                            e.reason)
               for e in edges if unit(e.importer) != unit(e.imported)]
    assert graph.circles(between) == []


def test_few_top_level_modules_outside_packages(files):
    top = [m for m, path in files.items() if m.count(".") == 1 and path.name != "__init__.py"]
    assert len(top) <= 15, sorted(top)

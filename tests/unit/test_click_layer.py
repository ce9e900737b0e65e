"""click belongs to the command layer: settings, the distros and the network code
describe options in words (settings.CliOption) and the CLI makes the click options."""

from __future__ import annotations

import ast
from pathlib import Path

import installer
from installer.distros import DISTROS
from installer.settings import DistroOptions

ROOT = Path(installer.__file__).parent


def _imports_click(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "click" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "click":
            return True
    return False


def test_settings_the_distros_and_the_network_code_never_import_click():
    below_the_cli = [ROOT / "settings.py", *sorted((ROOT / "distros").rglob("*.py")),
                     *sorted((ROOT / "net").rglob("*.py"))]
    assert [str(p.relative_to(ROOT)) for p in below_the_cli if _imports_click(p)] == []


def test_every_distro_option_is_declared_and_read_back():
    """What the CLI calls on a distro's options is declared by DistroOptions (a type
    checker holds it), and each declared option comes back from from_cli."""
    for distro in DISTROS:
        options = distro.options
        if options is None:
            continue
        assert issubclass(options, DistroOptions) and options.cli_options
        parsed = {spec.dest: spec.default for spec in options.cli_options}
        assert options.given(parsed)
        options.from_cli(parsed)
        assert parsed == {}, f"{options.__name__}.from_cli left {sorted(parsed)} unread"

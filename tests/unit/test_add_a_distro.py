"""docs/development/add-a-distro.md, followed to the letter in a copy of the package: one new module
and one line in ``DISTROS``; then ``lint-imports`` keeps every contract and ``install
--dry-run`` on a node of the new distro plans its headers build (and, without the line,
the same node is refused as an unsupported host)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.kernel import FakeKernel
from tests.fixtures.node import UBUNTU_KERNEL, build_ubuntu_node

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# Step 1 of the recipe: the new module, a HeadersBuild subclass declaring what it says.
THROWAWAY = '''"""A distro added by the README's recipe, for the test."""

from installer.distros.headers_build import HeadersBuild


class Throwaway(HeadersBuild):
    name = "throwaway"
    title = "Throwaway Linux"
    os_ids = ("throwaway",)
    gke_os_distributions = ()
    image_suffix = "ubuntu"
'''


def _recipe() -> str:
    text = (REPO / "docs/development/add-a-distro.md").read_text()
    return text.split("## Add a distro", 1)[1].split("\n## ", 1)[0]


def _copy_with_throwaway(dest: Path, *, register: bool) -> Path:
    """The package and its contracts, plus the recipe's module (and, with ``register``,
    its line in DISTROS)."""
    shutil.copytree(REPO / "installer", dest / "installer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    (dest / "installer/distros/throwaway.py").write_text(THROWAWAY)
    if register:  # step 2: import the class, add it to DISTROS
        init = dest / "installer/distros/__init__.py"
        text = init.read_text()
        text = text.replace("from installer.distros.ubuntu import Ubuntu\n",
                            "from installer.distros.ubuntu import Ubuntu\n"
                            "from installer.distros.throwaway import Throwaway\n", 1)
        registered = re.sub(r"(DISTROS: tuple\[type\[Distro\], \.\.\.\] = \([^)]*)\)",
                            r"\1, Throwaway)", text, count=1)
        assert registered != text, "DISTROS is no longer one tuple: update the recipe"
        init.write_text(registered)
    return dest


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def throwaway_node(tmp_path):
    node = build_ubuntu_node(tmp_path / "node")
    (node.root / "etc/os-release").write_text(
        'ID=throwaway\nVERSION_ID=1\nPRETTY_NAME="Throwaway Linux 1"\n')
    kernel = FakeKernel(tmp_path / "kernel", UBUNTU_KERNEL)
    kernel.add_gpu()  # an NVIDIA L4
    return node, kernel


def test_the_recipe_names_one_module_and_one_registration():
    recipe = _recipe()
    assert "`installer/distros/<name>.py`: a `HeadersBuild` subclass" in recipe
    assert "`installer/distros/__init__.py`: import the class and add it to `DISTROS`" in recipe
    assert "flows.py" not in recipe.split("2. ", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("register", [True, False])
def test_a_throwaway_distro_added_by_the_recipe_lints_and_plans(tmp_path, throwaway_node,
                                                                 register):
    node, kernel = throwaway_node
    copy = _copy_with_throwaway(tmp_path / "repo", register=register)
    env = kernel.subprocess_env()
    env["PYTHONPATH"] = f"{copy}:{env['PYTHONPATH']}"
    env["KERNEL_RELEASE"] = UBUNTU_KERNEL
    where = _run([sys.executable, "-c", "import installer; print(installer.__file__)"], copy, env)
    assert where.stdout.strip() == str(copy / "installer/__init__.py"), where.stderr

    lint = _run([str(LINT_IMPORTS)], copy, env)
    assert lint.returncode == 0 and "0 broken" in lint.stdout, lint.stdout[-3000:]

    dry = _run([sys.executable, "-m", "installer", "install", "--dry-run", "-o", "json",
                "--host-root", str(node.root), "--install-dir", str(node.install_dir),
                "--driver-base-url", f"file://{tmp_path}/tesla", "--log-format", "json"],
               copy, env)
    if not register:  # the module alone is not a distro yet: the host is refused
        assert dry.returncode == 3, dry.stderr[-3000:]
        assert "unsupported host OS 'throwaway'" in dry.stderr
        return
    assert dry.returncode == 0, dry.stderr[-3000:]
    doc = json.loads(dry.stdout)
    assert doc["dry_run"] is True and doc["kind"] == "fresh"
    steps = [s["name"] for s in doc["steps"]]
    assert "find_kernel_headers" in steps and "build_driver" in steps
    assert '"flow": "throwaway"' in dry.stderr  # the host_detected event
    assert not any(node.install_dir.iterdir())

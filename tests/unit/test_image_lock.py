"""images/requirements.lock: what the images install, every file pinned by sha256."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "images/requirements.lock"


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes), from pip-compile's format (continuation lines)."""
    text = LOCK.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"not a hash-pinned requirement: {line!r}"
        out[canonicalize_name(m[1])] = (m[2], re.findall(r"sha256:([0-9a-f]{64})", m[3]))
    return out


def test_every_dependency_is_locked_at_a_version_pyproject_allows():
    """The runtime dependencies and the wheel's build requirements (setuptools): the
    images build the wheel without build isolation, so nothing is fetched unpinned."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    lock = locked()
    for dep in map(Requirement, deps):
        name = canonicalize_name(dep.name)
        assert name in lock, f"{dep.name} is not in images/requirements.lock: run make lock"
        assert dep.specifier.contains(lock[name][0], prereleases=True), (
            f"{dep.name}=={lock[name][0]} does not satisfy {dep}: run make lock")


def test_every_locked_file_has_a_hash_and_nothing_points_at_an_index():
    text = LOCK.read_text()
    assert all(hashes for _version, hashes in locked().values())
    assert not re.search(r"^\s*-(-index-url|-extra-index-url|-find-links|i|f)\b", text, re.M)


def test_the_images_install_from_the_lock_with_require_hashes():
    for flavor in ("cos", "ubuntu"):
        dockerfile = (ROOT / f"images/{flavor}/Dockerfile").read_text()
        assert "COPY images/requirements.lock" in dockerfile
        assert re.search(r"pip install [^\n]*--require-hashes -r requirements\.lock", dockerfile)
        # The wheel is built from the locked setuptools, not one pip fetches unhashed.
        assert re.search(r"pip wheel [^\n]*--no-build-isolation", dockerfile)
        # Our own wheel comes in without dependencies: nothing unpinned rides along.
        assert re.search(r"pip install [^\n]*--no-deps /wheels/", dockerfile)


def test_the_cli_installs_without_the_test_and_lint_tools():
    """Issue 41 §4: `pip install .` is the CLI alone. The runtime dependencies are exactly
    the distributions installer/ imports; pytest, ruff and the rest are the `test` and
    `lint` extras, which `make install` (and so .ci/run) still installs."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = {canonicalize_name(Requirement(d).name) for d in pyproject["project"]["dependencies"]}
    extras = pyproject["project"]["optional-dependencies"]
    tools = {canonicalize_name(Requirement(d).name) for group in ("test", "lint")
             for d in extras[group]}
    assert {"pytest", "ruff"} <= tools and not runtime & tools
    imported = set()
    for path in (ROOT / "installer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"installer"}
    owners = packages_distributions()
    needed = {canonicalize_name(dist) for mod in third_party for dist in owners.get(mod, [mod])}
    # urllib3 comes with requests (its own dependency), and is imported for its exceptions.
    assert needed - {"urllib3"} == runtime, (sorted(needed), sorted(runtime))
    assert "pip install -q -e '.[test,lint]'" in (ROOT / "Makefile").read_text()


def test_another_architectures_venv_is_made_natively_from_that_architectures_wheels():
    """The build stage (the venv) runs on the build machine's architecture, so an arm64
    image's pip runs without qemu-user; pip then takes the image's architecture's wheels,
    and wheels only (an sdist would be compiled for the build machine)."""
    for flavor in ("cos", "ubuntu"):
        dockerfile = (ROOT / f"images/{flavor}/Dockerfile").read_text()
        froms = re.findall(r"^FROM .*$", dockerfile, re.M)
        assert froms[0] == "FROM --platform=$BUILDPLATFORM $BUILD_BASE AS build", froms
        # The runtime stage is the image's own architecture: its RUN steps are the image's.
        assert froms[-1].startswith("FROM --platform=$TARGETPLATFORM docker.io/library/")
        default = re.search(r"^ARG BUILD_BASE=(\S+)$", dockerfile, re.M)
        assert default and froms[-1].endswith(" " + default[1])  # the same distribution
        deps = dockerfile.split("COPY images/requirements.lock ./\n", 1)[1].split("\nCOPY", 1)[0]
        assert "arm64) export _PYTHON_HOST_PLATFORM=linux-aarch64" in deps
        assert "cross=--only-binary=:all:" in deps
        assert '${cross:+"$cross"} --require-hashes -r requirements.lock' in deps


def test_pip_takes_its_platform_tags_from_python_host_platform(tmp_path):
    """What the cross install above relies on: sysconfig.get_platform() returns
    _PYTHON_HOST_PLATFORM (CPython Lib/sysconfig.py, "Set for cross builds explicitly")
    and pip's platform tags follow it (packaging's tags._linux_platforms)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "_PYTHON_HOST_PLATFORM": "linux-aarch64", "PIP_NO_INPUT": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "debug", "--verbose"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tags = {line.strip() for line in proc.stdout.splitlines()}
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"{py}-{py}-manylinux2014_aarch64" in tags
    assert not any(tag.endswith("x86_64") for tag in tags)

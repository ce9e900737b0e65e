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

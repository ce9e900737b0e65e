"""Fixtures of the real-parts tier: NVIDIA's real parts, this machine's kernel headers,
the .run files. Each is provisioned once and cached (see provision.py, cache.py).

Environment:
  NDI_REALPARTS_REQUIRED=1  fail (instead of skip) when the parts cannot be had (CI)
  NDI_REALPARTS_CACHE=DIR   cache dir (default /var/cache/ndi-realparts)
  NDI_REALPARTS_REFRESH=1   re-read the archive's package lists
  NDI_REALPARTS_NO_CACHE=1  redo the cached archives and builds
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.runfile import driver_payload
from tests.realparts import kbuild, provision, runfile


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "realparts: uses NVIDIA's real driver parts from Debian's archive (minutes when cold)"
    )


def _unavailable(what: str, exc: Exception) -> None:
    msg = f"{what}: {exc}"
    if os.environ.get("NDI_REALPARTS_REQUIRED") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def real_parts() -> provision.RealParts:
    try:
        provision.host_tools()
        return provision.provision()
    except provision.ProvisionError as e:
        _unavailable("NVIDIA's real parts cannot be provisioned", e)


@pytest.fixture(scope="session")
def headers(real_parts: provision.RealParts) -> kbuild.Headers:
    try:
        return kbuild.kernel_headers()
    except provision.ProvisionError as e:
        _unavailable("no Debian kernel headers to build against", e)


@pytest.fixture(scope="session")
def run_main(real_parts: provision.RealParts) -> Path:
    """NVIDIA-Linux-x86_64-535.x.run: kernel/, kernel-open/, firmware/ (shared: do not modify)."""
    return runfile.build_real_run(real_parts.main.version, "full", real_parts)


@pytest.fixture(scope="session")
def run_legacy(real_parts: provision.RealParts) -> Path:
    """NVIDIA-Linux-x86_64-470.x.run: kernel/ only."""
    return runfile.build_real_run(real_parts.legacy.version, "full", real_parts)


@pytest.fixture(scope="session")
def run_r550(real_parts: provision.RealParts) -> Path:
    """NVIDIA-Linux-x86_64-550.x.run (Debian 13's parts): kernel/, kernel-open/, firmware/.
    With the fixture's user space: the very .run the qemu tier builds its 550 installs from
    (tests/vm/host_builds.py), so the tier packs it once; its tests here run only the
    stand-in nvidia-installer, which both .runs share."""
    v = real_parts.r550.version
    return runfile.build_real_run(v, "full", real_parts, userspace=driver_payload(v))


def _extract(run: Path, dest: Path) -> Path:
    subprocess.run(["sh", str(run), "-x", "--target", str(dest)], check=True, capture_output=True)
    return dest


@pytest.fixture(scope="session")
def pkg_main(run_main: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 535 .run extracted (sh .run -x --target DIR)."""
    return _extract(run_main, tmp_path_factory.mktemp("pkg") / "main")


@pytest.fixture(scope="session")
def pkg_legacy(run_legacy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _extract(run_legacy, tmp_path_factory.mktemp("pkg") / "legacy")


@pytest.fixture(scope="session")
def pkg_r550(run_r550: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _extract(run_r550, tmp_path_factory.mktemp("pkg") / "r550")

"""The nvidia-installer argv passes each release only what its option_table.h has
(tests/fixtures/nvidia_installer_options.json, read from NVIDIA/nvidia-installer at its
release tags): an unknown option is ``Invalid commandline`` and exit 1 there."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.base.errors import UsageError
from installer.driver import module_build
from installer.driver.nvidia_options import (
    FIRST_RELEASE,
    KERNEL_MODULE_OPTIONS,
    accepts,
    check_loads_nothing,
    installer_args,
)
from installer.host import gpus
from installer.kmod.headers import KernelTree
from tests.fixtures import nvidia_options as tables

TABULATED = tables.tabulated()
# Every version the installer can pick by itself, plus the tabulated releases.
PICKED = sorted({*gpus.FALLBACK_VERSIONS, "550.127.05", "535.183.01", *TABULATED},
                key=tables.version_key)


def _argv(version):
    return installer_args(version=version)


@pytest.mark.parametrize("version", PICKED)
def test_every_option_passed_is_in_that_releases_table(version):
    assert tables.unknown(version, _argv(version)) == []


@pytest.mark.parametrize("version", PICKED)
def test_every_release_gets_user_space_only(version):
    """--no-kernel-module, the spelling every release has; nothing that builds, installs,
    loads or unloads a module (install-from-cwd.c, kernel.c at the release tags)."""
    argv = _argv(version)
    assert "--no-kernel-module" in argv
    names = {a.split("=", 1)[0] for a in argv}
    assert not names & set(KERNEL_MODULE_OPTIONS)
    check_loads_nothing(argv)


@pytest.mark.parametrize("argv", [
    ["./nvidia-installer", "--silent"],
    ["./nvidia-installer", "--no-kernel-module", "--skip-module-load"],
    ["./nvidia-installer", "--no-kernel-module", "--kernel-module-only"],
    ["./nvidia-installer", "--no-kernel-module", "--kernel-name=6.1.0-56-amd64"],
])
def test_an_argv_that_could_touch_modules_is_a_bug(argv):
    with pytest.raises(AssertionError, match="would build or load modules"):
        check_loads_nothing(argv)


@pytest.mark.parametrize("option", sorted(FIRST_RELEASE))
def test_first_release_table_matches_nvidias_history(option):
    """Our gate for each option is the first tag the real tables have it."""
    seen = tables.first_seen()
    key = option.removeprefix("--")
    if key == "no-systemd":
        key = "no-systemd" if "no-systemd" in seen else "systemd"
    assert FIRST_RELEASE[option] == seen[key]["first"]
    for version in TABULATED:
        assert accepts(version, option) == (option in tables.accepted(version)), version


def test_no_systemd_from_465():
    assert "--no-systemd" in _argv("470.256.02")


def test_module_build_dir_by_type_and_release():
    assert module_build.build_dir("570.86.16", "open") == "kernel-open"
    assert module_build.build_dir("555.42.02", "proprietary") == "kernel"
    assert module_build.build_dir("535.261.03", "open") == "kernel-open"
    # The release's own default: open from R560 (what the .run builds without -M/-m).
    assert module_build.build_dir("560.35.03", None) == "kernel-open"
    assert module_build.build_dir("550.127.05", None) == "kernel"
    with pytest.raises(UsageError, match="no open kernel modules"):
        module_build.build_dir("470.256.02", "open")


def test_make_passes_split_headers_and_jobs():
    argv = module_build.make_argv("/x/kernel", KernelTree(Path("/src"), Path("/out")), 3)
    assert argv == ["make", "-C", "/x/kernel", "SYSSRC=/src", "SYSOUT=/out", "-j3", "modules"]


def test_releases_older_than_supported_are_refused():
    with pytest.raises(UsageError, match="older than this installer supports"):
        _argv("460.106.00")

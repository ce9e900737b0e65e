"""The nvidia-installer argv passes each release only what its option_table.h has
(tests/fixtures/nvidia_installer_options.json, read from NVIDIA/nvidia-installer at its
release tags): an unknown option is ``Invalid commandline`` and exit 1 there."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer import gpus
from installer.errors import UsageError
from installer.nvidia_options import FIRST_RELEASE, accepts, installer_args
from tests.fixtures import nvidia_options as tables

TABULATED = tables.tabulated()
# Every version the installer can pick by itself, plus the tabulated releases.
PICKED = sorted({*gpus.FALLBACK_VERSIONS, "550.127.05", "535.183.01", *TABULATED},
                key=tables.version_key)


def _argv(version, module_type, source=Path("/src"), output=Path("/out")):
    return installer_args(version=version, kernel_release="6.1.0-56-amd64",
                          kernel_source_path=source, kernel_output_path=output,
                          concurrency=2, module_type=module_type)


@pytest.mark.parametrize("version", PICKED)
def test_every_option_passed_is_in_that_releases_table(version):
    module_types = [None, "proprietary"] + (["open"] if tables.version_key(version) >= (515,) else [])
    for module_type in module_types:
        assert tables.unknown(version, _argv(version, module_type)) == [], module_type
    userspace = _argv(version, None, source=None, output=None)
    assert tables.unknown(version, userspace) == []
    assert "--no-kernel-module" in userspace


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


def test_r535_gets_no_skip_module_load_and_r550_does():
    assert "--skip-module-load" not in _argv("535.261.03", None)
    assert "--skip-module-load" in _argv("550.127.05", None)
    assert "--no-systemd" in _argv("470.256.02", None)


def test_module_type_spelling_by_release():
    assert "--kernel-module-type=open" in _argv("570.86.16", "open")
    assert "--kernel-module-type=proprietary" in _argv("555.42.02", "proprietary")
    assert "--kernel-module-build-directory=kernel-open" in _argv("535.261.03", "open")
    assert not any("kernel-module" in a for a in _argv("535.261.03", "proprietary")[1:]
                   if "path" not in a)
    with pytest.raises(UsageError, match="no open kernel modules"):
        _argv("470.256.02", "open")


def test_split_headers_pass_both_paths_and_a_single_tree_one():
    argv = _argv("535.261.03", None)
    assert "--kernel-source-path=/src" in argv and "--kernel-output-path=/out" in argv
    one = _argv("535.261.03", None, source=Path("/t"), output=Path("/t"))
    assert not any(a.startswith("--kernel-output-path") for a in one)


def test_releases_older_than_supported_are_refused():
    with pytest.raises(UsageError, match="older than this installer supports"):
        _argv("460.106.00", None)

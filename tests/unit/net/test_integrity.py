"""installer.net.integrity: one rule for a sha256 pin, wherever it is given."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from installer.base.errors import UsageError
from installer.net.integrity import normalize_sha256
from installer.net.transfer import download
from installer.settings import Settings, validate

HEX = hashlib.sha256(b"driver").hexdigest()


@pytest.mark.parametrize("given", [HEX, HEX.upper(), f"sha256:{HEX}", f"SHA256:{HEX.upper()}",
                                   f"  {HEX}\n"])
def test_hex_in_any_case_with_or_without_the_prefix_is_one_pin(given):
    assert normalize_sha256(given) == HEX


@pytest.mark.parametrize("given", ["abc", HEX[:-1], HEX + "0", "sha256:", f"sha512:{HEX}",
                                   f"md5:{HEX}", HEX[:-1] + "g"])
def test_anything_else_is_a_usage_error_naming_the_value(given):
    with pytest.raises(UsageError, match="64 hex digits") as info:
        normalize_sha256(given, "--driver-sha256")
    assert info.value.exit_code == 2 and "--driver-sha256" in info.value.message


def test_none_means_unpinned():
    assert normalize_sha256(None) is None


def test_the_flag_and_a_download_accept_the_same_forms(tmp_path):
    """Settings once refused ``sha256:<hex>`` that a download accepted."""
    src = tmp_path / "NVIDIA.run"
    src.write_bytes(b"driver")
    settings = validate(Settings(driver_sha256=f"sha256:{HEX.upper()}",
                        install_dir=tmp_path / "install"))
    assert settings.driver_sha256 == HEX
    got = download(None, src.as_uri(), tmp_path / "out" / "NVIDIA.run",
                   expected_sha256=f"sha256:{HEX}")
    assert got.sha256 == HEX and Path(got.path).read_bytes() == b"driver"

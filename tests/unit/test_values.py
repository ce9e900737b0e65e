"""installer.base.values: one reading of driver versions, kernel releases and sha256 digests,
whoever asks (settings, the context, bundles, the COS pins, downloads)."""

from __future__ import annotations

import hashlib

import pytest

from installer.base import values
from installer.base.errors import UsageError
from installer.distros.cos.pins import Manifest as PinManifest
from installer.net.integrity import normalize_sha256
from installer.records.bundle_manifest import BundleError, BundleKey, check_sha256
from installer.settings import Settings, validate

HEX = hashlib.sha256(b"driver").hexdigest()
LONGEST = "6." + "1" * (values.KERNEL_RELEASE_MAX - 2)  # utsname's release holds 64


def test_kernel_release_limit_is_utsnames_in_settings_and_bundles(tmp_path):
    assert len(LONGEST) == 64 and values.is_kernel_release(LONGEST)
    BundleKey("550.54.14", LONGEST, "open")  # accepted by both
    validate(Settings(kernel_release=LONGEST, install_dir=tmp_path))
    too_long = LONGEST + "1"
    with pytest.raises(BundleError, match="not a uname -r value"):
        BundleKey("550.54.14", too_long, "open")
    with pytest.raises(UsageError, match="is not a kernel release") as info:
        validate(Settings(kernel_release=too_long, install_dir=tmp_path))
    assert "at most 64 characters" in (info.value.hint or "")


@pytest.mark.parametrize("release", ["-rf", ".hidden", "a/b", "6..1", "6.1 0", "6.1\n", ""])
def test_a_release_that_is_no_file_name_is_refused_everywhere(release, tmp_path):
    assert not values.is_kernel_release(release)
    with pytest.raises(BundleError):
        BundleKey("550.54.14", release, "open")


@pytest.mark.parametrize("given", [HEX, HEX.upper(), f"sha256:{HEX}", f"SHA256:{HEX.upper()}"])
def test_every_sha256_reader_accepts_the_same_forms(given):
    assert values.sha256_digest(given) == HEX
    assert normalize_sha256(given) == HEX
    assert check_sha256(given, "the sha256") == HEX
    pins = PinManifest.parse(f"{given}  kernel-headers.tgz\n", "test")
    assert pins.digests == {"kernel-headers.tgz": HEX}


@pytest.mark.parametrize("given", [HEX[:-1], HEX + "0", f"sha512:{HEX}", HEX[:-1] + "g", ""])
def test_every_sha256_reader_refuses_the_same_forms(given):
    assert values.sha256_digest(given) is None
    with pytest.raises(UsageError):
        normalize_sha256(given)
    with pytest.raises(BundleError):
        check_sha256(given, "the sha256")
    with pytest.raises(UsageError):
        PinManifest.parse(f"{given}  kernel-headers.tgz\n", "test")


@pytest.mark.parametrize("version", ["550.127.05", "390.157"])
def test_driver_versions_in_bundles_are_the_installers(version):
    assert values.is_driver_version(version)
    assert BundleKey(version, "6.1.0", "open").driver_version == version


@pytest.mark.parametrize("version", ["550.127.05\n", "٥٥٠.127.05", "5.1", "550"])
def test_bundles_refuse_what_the_installer_refuses(version):
    assert not values.is_driver_version(version)
    with pytest.raises(BundleError):
        BundleKey(version, "6.1.0", "open")

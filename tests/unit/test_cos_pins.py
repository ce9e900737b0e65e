"""installer.distros.cos.pins: the COS artifacts manifest."""

from __future__ import annotations

import pytest

from installer.base.errors import IntegrityError, UsageError
from installer.distros.cos.pins import Manifest, load

A, B = "a" * 64, "b" * 64


def test_sha256sum_output_is_read_by_path_or_file_name():
    m = Manifest.parse(f"{A}  kernel-headers.tgz\n{B} *extensions/gpu/x-custom.run\n# c\n", "m")
    assert m.require("https://h/cos-tools/1.2/kernel-headers.tgz", "headers") == A
    assert m.require("https://h/cos-tools/1.2/extensions/gpu/x-custom.run", "run") == B
    with pytest.raises(IntegrityError, match="not pinned by the COS artifacts manifest"):
        m.require("https://h/cos-tools/1.2/toolchain.tar.xz", "toolchain")


def test_listed_metadata_must_match():
    import hashlib

    digest = hashlib.sha256(b"CC=x\n").hexdigest()
    m = Manifest.parse(f"{digest}  toolchain_env\n", "m")
    m.check_text("toolchain_env", "CC=x\n", "https://h/toolchain_env")
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        m.check_text("toolchain_env", "CC=/tmp/evil\n", "https://h/toolchain_env")
    # Unlisted metadata is never accepted (issue 22: an unlisted toolchain_env ran code).
    with pytest.raises(IntegrityError, match="not pinned by the COS artifacts manifest"):
        m.check_text("toolchain_url", "anything", "https://h/toolchain_url")
    with pytest.raises(IntegrityError, match="does not publish it"):
        m.check_text("toolchain_env", None, "https://h/toolchain_env")


@pytest.mark.parametrize("text", ["", "not a manifest\n", f"{A[:-1]}  x\n"])
def test_malformed_manifests_are_usage_errors(text, tmp_path):
    (tmp_path / "m").write_text(text)
    with pytest.raises(UsageError):
        load(str(tmp_path / "m"), lambda url: None)


def test_a_missing_manifest_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read the COS artifacts manifest"):
        load(str(tmp_path / "nope"), lambda url: None)
    with pytest.raises(UsageError, match="does not exist"):
        load("https://h/SHA256SUMS", lambda url: None)

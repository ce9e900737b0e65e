"""Issue 33 item 6: a prebuilt bundle is not decompressed before its digest matches, and
writes no more than its manifest declares.

On abf8713 the bundle was extracted while it downloaded and its digest checked at the end:
a bundle failing its pin still had its manifest read (the refusal named the manifest, not
the digest) and all of its members decompressed and written, up to 16 GiB, and a member
larger than the manifest declares was written whole (only the later tree check noticed).
"""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from installer.base.errors import IntegrityError
from installer.bundle import fetch
from installer.records.bundle_manifest import BundleKey, FileEntry, Manifest
from tests.attacks.conftest import V, outcome

KERNEL = "5.15.0-1049-gke"
KEY = BundleKey(V, KERNEL, "proprietary")


def _bundle(path, members: dict[str, bytes]) -> str:
    """A gzip tar of ``members`` in order; its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.chroot
def test_a_bundle_failing_its_pin_is_never_decompressed(ubuntu):
    bundle = ubuntu.node.path("/srv/bundles/b.tar.gz")
    bundle.parent.mkdir(parents=True)
    digest = _bundle(bundle, {"manifest.json": b"{}", "drivers/nvidia.ko": bytes(1 << 20)})
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:]
    ubuntu.snapshot()
    proc = ubuntu.run("install", "--prebuilt-url", "file:///root/srv/bundles/b.tar.gz",
                      "--prebuilt-sha256", wrong)
    last = outcome(proc, 6, "sha256 mismatch")
    assert "manifest" not in last["message"]  # never read: nothing was decompressed
    assert "archive_extracted" not in proc.stderr
    ubuntu.assert_host_unchanged()


def test_a_bundle_writes_no_more_than_its_manifest_declares(tmp_path):
    declared = Manifest(KEY, f"{KERNEL} SMP mod_unload", "gcc", False, "t", "0", None,
                        {"drivers/nvidia.ko": FileEntry("b" * 64, 3)})
    _bundle(tmp_path / "b.tar.gz", {"manifest.json": declared.to_json().encode(),
                                    "drivers/nvidia.ko": bytes(1 << 20)})
    with pytest.raises(IntegrityError, match="more than 3 bytes of content"):
        fetch.extract(tmp_path / "b.tar.gz", tmp_path / "out", KEY,
                      lambda what: IntegrityError(what))
    assert not (tmp_path / "out").exists()

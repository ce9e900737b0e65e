"""Bundles of NVIDIA's real modules for the qemu tier, packed on the host (issue 15).

The real 535 install the installer built on the host (tests/realparts) is packed
by ``bundle build``'s own writer and indexed by ``bundle index``'s own code, so
the guest's ``install --prebuilt-url`` meets what a build Job would publish:

- ``bundles/``: the bundle for the guest's kernel and its ``index.json``;
- ``tampered/``: the same ``index.json`` beside a copy of the bundle with bytes
  changed (its digest no longer matches the pinned one);
- ``other-kernel/``: a bundle built for another kernel release (every module's
  vermagic and symbol CRCs rewritten, as ``driver_run.as_built_for`` does), its
  manifest honest about that.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from installer.bundle import index
from installer.commands import bundle_build as build
from installer.records.bundle_manifest import BundleKey
from tests.vm import driver_run


@dataclasses.dataclass(frozen=True)
class Bundles:
    key: BundleKey  # the guest's (driver, kernel, module type)
    other_name: str  # other-kernel/<other_name>
    other_sha256: str


def _write(root: Path, key: BundleKey, out: Path) -> build.Written:
    manifest = build.make_manifest(root, key, compiler="gcc (the real-parts tier's build)",
                                   signed=False, driver_sha256=None)
    # A fast level: the tier's time budget is not for compressing (same format at any level).
    return build.write(root, manifest, out, level=3)


def make_indexed(install_dir: Path, key: BundleKey, dest: Path) -> build.Written:
    """One bundle and the index.json beside it, as a build Job publishes them."""
    written = _write(install_dir, key, dest)
    index.update(dest)
    return written


def make(install_dir: Path, key: BundleKey, data: Path, scratch: Path) -> Bundles:
    good = make_indexed(install_dir, key, data / "bundles")

    tampered = data / "tampered"
    tampered.mkdir()
    shutil.copy2(data / "bundles" / index.INDEX_NAME, tampered / index.INDEX_NAME)
    blob = bytearray(good.path.read_bytes())
    mid = len(blob) // 2
    blob[mid:mid + 16] = bytes(b ^ 0xFF for b in blob[mid:mid + 16])
    (tampered / good.path.name).write_bytes(bytes(blob))

    # Only drivers/: the kernel check needs nothing else, and the data disk stays small.
    other_release = driver_run.other_release(key.kernel_release)
    other_root = scratch / "other-kernel"
    shutil.copytree(install_dir / "drivers", other_root / "drivers")
    for ko in (other_root / "drivers").glob("*.ko"):
        driver_run.as_built_for(ko, key.kernel_release, other_release)
    other = _write(other_root, BundleKey(key.driver_version, other_release, key.module_type),
                   data / "other-kernel")
    shutil.rmtree(other_root)
    return Bundles(key, other.path.name, other.sha256)

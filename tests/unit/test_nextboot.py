"""nextboot: what is kept for the next boot is installed only if it is still for this node."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
import structlog

from installer.host.installdir import InstallDir
from installer.records import staged_driver as nextboot
from installer.records.cache import CacheKey, ModuleSource

KERNEL, UPDATED = "5.15.0-1049-gke", "5.15.0-1050-gke"
KEY = CacheKey("535.183.01", kernel_release=KERNEL, source=ModuleSource.COMPILED, module_type="open")


@pytest.fixture
def install(tmp_path) -> InstallDir:
    return InstallDir(tmp_path / "install", PurePosixPath("/home/kubernetes/bin/nvidia"))


def _stage(install: InstallDir, key: CacheKey = KEY) -> None:
    staging = install.new_staging()
    (staging.drivers / "nvidia.ko").write_bytes(b"\x7fELF module")
    (staging.lib64 / "libcuda.so.535.183.01").write_bytes(b"\x7fELF lib")
    (staging.root / "kernel-build.log").write_text("make: done\n")
    nextboot.stage(install, staging, key)


def test_a_staged_tree_for_this_key_fills_the_staging_dir(install):
    _stage(install)
    assert not install.staging_dir.exists() and nextboot.record(install).driver_version == KEY.driver_version
    staging = install.new_staging()
    assert nextboot.take(install, staging, KEY)
    assert (staging.drivers / "nvidia.ko").read_bytes() == b"\x7fELF module"
    assert (staging.root / "kernel-build.log").read_text() == "make: done\n"
    assert not install.next_boot_dir.exists()


@pytest.mark.parametrize("key, why", [
    (CacheKey("535.183.01", kernel_release=UPDATED, source=ModuleSource.COMPILED, module_type="open"),
     f"cached for kernel {KERNEL}, the node runs kernel {UPDATED}"),
    (CacheKey("550.54.14", kernel_release=KERNEL, source=ModuleSource.COMPILED, module_type="open"),
     "cached driver 535.183.01, want 550.54.14"),
    (CacheKey("535.183.01", kernel_release=KERNEL, source=ModuleSource.COMPILED,
              module_type="proprietary"),
     "cached open modules, want proprietary"),
])
def test_a_tree_staged_for_anything_else_is_discarded_saying_why(install, key, why):
    _stage(install)
    staging = install.new_staging()
    with structlog.testing.capture_logs() as logs:
        assert not nextboot.take(install, staging, key)
    assert not install.next_boot_dir.exists() and not any(staging.drivers.iterdir())
    (event,) = [e for e in logs if e["event"] == "next_boot_discarded"]
    assert event["reason"] == f"staged for the next boot, but {why}"


def test_a_staged_module_changed_since_is_discarded(install):
    _stage(install)
    (install.next_boot_dir / "drivers/nvidia.ko").write_bytes(b"\x7fELF other")
    with structlog.testing.capture_logs() as logs:
        assert not nextboot.take(install, install.new_staging(), KEY)
    (event,) = [e for e in logs if e["event"] == "next_boot_discarded"]
    assert "drivers/nvidia.ko" in event["reason"]


def test_nothing_staged_is_no_fill(install):
    assert not nextboot.take(install, install.new_staging(), KEY)


def test_staging_again_replaces_the_older_tree(install):
    _stage(install, CacheKey("550.54.14", kernel_release=KERNEL, source=ModuleSource.COMPILED,
                             module_type="open"))
    _stage(install)
    assert nextboot.record(install).driver_version == KEY.driver_version
    assert [p.name for p in Path(install.next_boot_dir, "lib64").iterdir()] == [
        "libcuda.so.535.183.01"]

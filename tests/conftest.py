"""Shared fixtures: the fixture machinery lives in tests/fixtures (a pytest plugin)."""

from __future__ import annotations

import os
import shutil

import pytest

pytest_plugins = ["tests.fixtures.pytest_plugin"]


@pytest.fixture(autouse=True)
def _fresh_structlog():
    """A test that runs the CLI in-process configures structlog (level, renderer): undo it,
    so the next test's capture_logs() sees every event."""
    yield
    import structlog

    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _real_kernel_roots():
    """Tests point the installer at a fake kernel through its seam (installer.kmod.kernel's
    use_roots, as tests/fixtures/kernelhook does in a child): every test ends with the real
    /proc, /sys and /dev again."""
    yield
    from installer.kmod import kernel

    kernel.use_roots(kernel.KernelRoots())


def pytest_collection_modifyitems(config, items):
    """Chroot tests need root (mounts) and unshare; say so instead of failing obscurely."""
    can_chroot = os.geteuid() == 0 and shutil.which("unshare") is not None
    if can_chroot:
        return
    skip = pytest.mark.skip(reason="needs root and unshare(1) for mount namespaces")
    for item in items:
        if "chroot" in item.keywords:
            item.add_marker(skip)

"""The arm64 tier's shared fixture: Debian's arm64 parts, provisioned once."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.arm64 import bundle_cross
from tests.arm64.provision import CrossParts, provision
from tests.debapt import ProvisionError

TYPES = ("open", "proprietary")


@pytest.fixture(scope="session")
def parts() -> CrossParts:
    """Skipped when the archive cannot be had (no network); NDI_ARM64_REQUIRED=1: fail."""
    try:
        return provision()
    except ProvisionError as exc:
        if os.environ.get("NDI_ARM64_REQUIRED") == "1":
            raise
        pytest.skip(f"Debian's arm64 parts cannot be had: {str(exc)[:300]}")


@pytest.fixture(scope="session")
def built(parts) -> dict[str, tuple[Path, dict]]:
    """module type -> (bundle dir, build record) of ``bundle build --arch arm64``, cached
    by content. Cold, the two builds run side by side (each a subprocess of its own:
    measured 1193 and 1198 s at load 5-12, against about twice that one after the other)."""
    with ThreadPoolExecutor(max_workers=len(TYPES)) as pool:
        futures = {t: pool.submit(bundle_cross.bundle_build, parts, t) for t in TYPES}
        return {t: f.result() for t, f in futures.items()}

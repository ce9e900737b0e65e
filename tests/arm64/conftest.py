"""The arm64 tier's shared fixture: Debian's arm64 parts, provisioned once."""

from __future__ import annotations

import os

import pytest

from tests.arm64.provision import CrossParts, provision
from tests.debapt import ProvisionError


@pytest.fixture(scope="session")
def parts() -> CrossParts:
    """Skipped when the archive cannot be had (no network); NDI_ARM64_REQUIRED=1: fail."""
    try:
        return provision()
    except ProvisionError as exc:
        if os.environ.get("NDI_ARM64_REQUIRED") == "1":
            raise
        pytest.skip(f"Debian's arm64 parts cannot be had: {str(exc)[:300]}")

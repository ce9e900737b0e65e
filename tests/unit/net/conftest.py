"""Fixtures for every net test: the shared HTTPS server and session, recorded waits."""

from __future__ import annotations

import pytest

from tests.fixtures.https import *  # noqa: F403 - the shared HTTPS fixtures


@pytest.fixture
def no_sleep(waits):
    """Record the waits the retryer asks for instead of sleeping them."""
    return waits

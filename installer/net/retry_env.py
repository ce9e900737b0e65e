"""The retry policy's environment knobs, read without the network stack (``install`` checks
them before anything else, issue 26; net.retry applies them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from installer.errors import UsageError

ENV_RETRIES = "DOWNLOAD_RETRIES"
ENV_TIMEOUT = "DOWNLOAD_TIMEOUT"


def read(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"attempts": …, "total_timeout": …}`` for the variables that are set.

    Raises UsageError naming the variable when a value is not valid.
    """
    env = os.environ if environ is None else environ
    changes: dict[str, Any] = {}
    raw = env.get(ENV_RETRIES, "").strip()
    if raw:
        try:
            attempts = int(raw)
        except ValueError:
            attempts = 0
        if attempts < 1:
            raise UsageError(
                f"{ENV_RETRIES}={raw!r} is not a valid number of attempts",
                hint="set it to an integer >= 1 (1 means no retry)",
            )
        changes["attempts"] = attempts
    raw = env.get(ENV_TIMEOUT, "").strip()
    if raw:
        try:
            total = float(raw)
        except ValueError:
            total = -1.0
        if not total > 0 or total == float("inf"):
            raise UsageError(
                f"{ENV_TIMEOUT}={raw!r} is not a valid total timeout",
                hint="set it to a number of seconds > 0",
            )
        changes["total_timeout"] = total
    return changes

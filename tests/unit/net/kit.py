"""Shared pieces of the net tests: a fast retry policy, a payload, a Range-aware handler."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from werkzeug import Request, Response

from installer.net.retry import RetryPolicy

FAST = RetryPolicy(
    attempts=4,
    wait_initial=0.01,
    wait_max=0.05,
    total_timeout=30,
    connect_timeout=3,
    read_timeout=3,
)

PAYLOAD = random.Random(1234).randbytes(300_000)
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


def ranged(request: Request, payload: bytes = PAYLOAD) -> Response:
    """werkzeug's own Range handling (206 + Content-Range, 416)."""
    return Response(payload, mimetype="application/octet-stream").make_conditional(
        request, accept_ranges=True, complete_length=len(payload)
    )


def seen(server) -> list[Request]:
    return [req for req, _resp in server.log]


def no_part_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.endswith(".part")]

"""status.json: the outcome of the last run, for people and tools."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from installer import __version__
from installer.fsutil import read_limited, write_atomic
from installer.net.policy import scrub

MAX_BYTES = 1 << 20


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write(path: Path, **fields: Any) -> None:
    doc = scrub({"installer_version": __version__, "finished_at": now_iso(), **fields})
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def read(path: Path) -> dict[str, Any] | None:
    """The last run's record; None when there is none (or it is not JSON).

    Raises ``UnreadableFile`` for something that is not a small regular file
    (a FIFO there must not hang ``status`` or ``doctor``).
    """
    try:
        doc = json.loads(read_limited(path, MAX_BYTES))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None

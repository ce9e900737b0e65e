"""status.json: the outcome of the last run, for people and tools."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from installer import __version__
from installer.fsutil import write_atomic


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write(path: Path, **fields: Any) -> None:
    doc = {"installer_version": __version__, "finished_at": now_iso(), **fields}
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

"""status.json: the outcome of the last run (outcome.Outcome), for people and tools."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from installer import __version__
from installer.base import safejson
from installer.base.dataclass import dataclass
from installer.base.errors import IntegrityError, NotInstalledError
from installer.base.fsutil import UnreadableFile, read_limited, write_record
from installer.host.installdir import InstallDir
from installer.kmod.kernel import KernelState
from installer.kmod.modules import loaded_driver_version
from installer.net.policy import scrub
from installer.records import cache
from installer.records.outcome import Outcome

MAX_BYTES = 1 << 20


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write(path: Path, outcome: Outcome) -> Outcome:
    """Record ``outcome`` (stamped with this installer's version and the time); the
    outcome as written."""
    stamped = replace(outcome, installer_version=__version__, finished_at=now_iso())
    doc = scrub(stamped.to_status_json())
    write_record(path, json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return stamped


def read(path: Path) -> Outcome | None:
    """The last run's outcome; None when there is none.

    Raises ``UnreadableFile`` for something that is not a small regular file holding a
    JSON object with a valid exit code (a FIFO there must not hang ``status`` or
    ``doctor``; a corrupt file is reported as corrupt, not as missing).
    """
    try:
        raw = read_limited(path, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a symlink loop (ELOOP), EACCES...
        raise UnreadableFile(f"cannot be read: {exc.strerror}") from None
    try:
        doc = safejson.loads(raw, max_bytes=MAX_BYTES)
    except ValueError as exc:
        raise UnreadableFile(str(exc)) from None
    if not isinstance(doc, dict):
        raise UnreadableFile(f"holds a JSON {type(doc).__name__}, not an object")
    try:
        return Outcome.from_status_json(doc)
    except ValueError as exc:
        raise UnreadableFile(f"is not a run's outcome: {exc}") from None


@dataclass(frozen=True)
class Report:
    """The ``status`` command's document: the last run and the ``.cache`` record."""

    install_dir: Path
    last_run: Outcome | None
    record: cache.CacheRecord | None

    def to_json(self) -> dict[str, Any]:
        return {"install_dir": str(self.install_dir),
                "last_run": self.last_run.to_status_json() if self.last_run else None,
                "cache": self.record.fields if self.record else None}

    def exit_code(self) -> int:
        """The last run's exit code; ``NotInstalledError`` when the installer never ran here."""
        if self.last_run is not None:
            return self.last_run.exit_code
        where = str(self.install_dir)
        loaded = loaded_driver_version(KernelState()) if self.record is None else None
        if loaded is not None:  # a node image's driver (a real H100 node: tests/data/gpu-node)
            raise NotInstalledError(
                f"the installer has not run on this node (no status.json in "
                f"{where}); driver {loaded} is loaded, by the node image, not by "
                "this tool", hint="nothing to do while that driver is the one wanted (doctor "
                "checks it); to have this tool manage the driver, run install",
                path=where)
        raise NotInstalledError(
            f"the installer has not run on this node (no status.json in {where})",
            hint="run install, or check --install-dir / NVIDIA_INSTALL_DIR_CONTAINER names "
            "the driver's install dir", path=where)


def report(install: InstallDir) -> Report:
    try:
        last = read(install.status_file)
    except UnreadableFile as exc:
        raise IntegrityError(f"corrupt status file: {install.status_file} {exc.reason}",
                             hint="remove it; the next install writes a new one",
                             path=str(install.status_file)) from None
    return Report(install.root, last, cache.read(install.cache_file))

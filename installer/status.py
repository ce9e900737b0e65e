"""status.json: the outcome of the last run, for people and tools."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from installer import __version__, cache, safejson
from installer.errors import IntegrityError, NotInstalledError
from installer.fsutil import UnreadableFile, read_limited, write_record
from installer.installdir import InstallDir
from installer.kernel import KernelState
from installer.modules import loaded_driver_version
from installer.net.policy import scrub

MAX_BYTES = 1 << 20


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write(path: Path, **fields: Any) -> None:
    doc = scrub({"installer_version": __version__, "finished_at": now_iso(), **fields})
    write_record(path, json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def read(path: Path) -> dict[str, Any] | None:
    """The last run's record; None when there is none.

    Raises ``UnreadableFile`` for something that is not a small regular file holding a
    JSON object (a FIFO there must not hang ``status`` or ``doctor``; a corrupt file is
    reported as corrupt, not as missing).
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
    return doc


def report(install: InstallDir) -> dict[str, Any]:
    """The ``status`` command's document: the last run and the ``.cache`` record."""
    try:
        last = read(install.status_file)
    except UnreadableFile as exc:
        raise IntegrityError(f"corrupt status file: {install.status_file} {exc.reason}",
                             hint="remove it; the next install writes a new one",
                             path=str(install.status_file)) from None
    record = cache.read(install.cache_file)
    return {"install_dir": str(install.root), "last_run": last,
            "cache": record.fields if record else None}


def exit_code(doc: dict[str, Any]) -> int:
    """The last run's exit code; ``NotInstalledError`` when the installer never ran here."""
    if doc["last_run"] is None:
        loaded = loaded_driver_version(KernelState()) if doc["cache"] is None else None
        if loaded is not None:  # a node image's driver (a real H100 node: tests/data/gpu-node)
            raise NotInstalledError(
                f"the installer has not run on this node (no status.json in "
                f"{doc['install_dir']}); driver {loaded} is loaded, by the node image, not by "
                "this tool", hint="nothing to do while that driver is the one wanted (doctor "
                "checks it); to have this tool manage the driver, run install",
                path=doc["install_dir"])
        raise NotInstalledError(
            f"the installer has not run on this node (no status.json in {doc['install_dir']})",
            hint="run install, or check --install-dir / NVIDIA_INSTALL_DIR_CONTAINER names "
            "the driver's install dir", path=doc["install_dir"])
    code = doc["last_run"].get("exit_code", 0)
    if type(code) is not int or not 0 <= code <= 255:
        raise IntegrityError(f"corrupt status file in {doc['install_dir']}: exit_code is "
                             f"{str(code)[:40]!r}", hint="remove it; the next install writes a new one")
    return code

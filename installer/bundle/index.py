"""``index.json``: the digests of a directory of bundles, and what each one is.

::

    {"format": 1, "bundles": {"<bundle name>": {"sha256": "...", "size": N,
                                                 "driver_version": ..., "kernel_release": ...,
                                                 "module_type": ..., "vermagic": ..., ...}}}

Nodes fetch it over https (or file://) from beside the bundles and take the
bundle's sha256 from it, so a bundle swapped on the server fails its digest
(exit 6). Both ``.tar.zst`` and (older) ``.tar.gz`` bundles are indexed.
``bundle index DIR`` writes it from the bundles in DIR, each one's
manifest read from the archive and checked against its file name.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import structlog

from installer.base import safejson
from installer.base.dataclass import dataclass
from installer.base.fsutil import sha256_file, write_atomic
from installer.jail.tarstream import UnreadableArchive, read_first_member
from installer.records.bundle_manifest import (
    FORMAT,
    INDEX_NAME,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SUFFIXES,
    BundleError,
    BundleKey,
    Manifest,
    check_sha256,
)

log = structlog.get_logger(__name__)

MAX_INDEX_BYTES = 16 << 20
MAX_ENTRIES = 50_000
LOCK_NAME = ".index.lock"


@dataclass(frozen=True)
class IndexEntry:
    sha256: str
    size: int
    summary: dict[str, object]


def parse(text: str) -> dict[str, IndexEntry]:
    """The entries of an index, every name, digest and key checked."""
    try:
        doc = safejson.loads(text, max_bytes=MAX_INDEX_BYTES)
    except ValueError as exc:
        raise BundleError(f"the index {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError(f"the index is not a format-{FORMAT} bundle index")
    bundles = doc.get("bundles")
    if not isinstance(bundles, dict) or len(bundles) > MAX_ENTRIES:
        raise BundleError(f"the index's bundles are not an object of at most {MAX_ENTRIES}")
    out = {}
    for name, entry in bundles.items():
        key = BundleKey.from_name(name)
        if not isinstance(entry, dict):
            raise BundleError(f"the index entry of {name} is not an object")
        size = entry.get("size")
        if type(size) is not int or size < 0:
            raise BundleError(f"the index entry of {name} has no size")
        for field, want in (("driver_version", key.driver_version),
                            ("kernel_release", key.kernel_release),
                            ("module_type", key.module_type)):
            if entry.get(field) != want:
                raise BundleError(f"the index entry of {name} says {field} "
                                  f"{entry.get(field)!r}, its name says {want!r}")
        sha = check_sha256(entry.get("sha256"), f"the sha256 of {name} in the index")
        out[name] = IndexEntry(sha, size, {k: v for k, v in entry.items()
                                           if k not in ("sha256", "size")})
    return out


def render(entries: dict[str, IndexEntry]) -> str:
    bundles = {name: {"sha256": e.sha256, "size": e.size, **e.summary}
               for name, e in sorted(entries.items())}
    return json.dumps({"format": FORMAT, "bundles": bundles}, indent=1) + "\n"


def read_manifest(archive: Path) -> Manifest:
    """The manifest of a bundle file: its first member, bounded, without unpacking the rest."""
    try:
        return Manifest.from_json(read_first_member(archive, MANIFEST_NAME, MAX_MANIFEST_BYTES))
    except UnreadableArchive as exc:
        raise BundleError(str(exc)) from None


def entry_for(path: Path) -> IndexEntry:
    """The index entry of one bundle file; its manifest must be for the key its name says."""
    manifest = read_manifest(path)
    if path.name not in manifest.key.names():
        raise BundleError(f"its manifest is for {manifest.key.name()}")
    return IndexEntry(sha256_file(path), path.stat().st_size, manifest.summary())


def _existing(path: Path) -> dict[str, IndexEntry]:
    if not path.exists():
        return {}
    try:
        return parse(path.read_text())
    except (BundleError, UnicodeDecodeError) as exc:
        log.warning("bundle_index_rewritten", path=str(path), reason=str(exc))
        return {}


def update(directory: Path, *, prune: bool = False) -> tuple[dict[str, IndexEntry], list[str]]:
    """(Re)write ``directory/index.json`` from the bundles there; returns the entries and
    the bundles left out with why. Entries of bundles no longer in the directory stay
    (the bundles may have been uploaded and removed here) unless ``prune``.

    Serialised by a lock file, so the pods of one build Job can each add their bundle.
    """
    with open(directory / LOCK_NAME, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        path = directory / INDEX_NAME
        entries = _existing(path)
        if prune:
            entries = {n: e for n, e in entries.items() if (directory / n).is_file()}
        refused = []
        for bundle in sorted(p for suffix in SUFFIXES for p in directory.glob(f"*{suffix}")):
            try:
                BundleKey.from_name(bundle.name)
                entries[bundle.name] = entry_for(bundle)
            except BundleError as exc:
                entries.pop(bundle.name, None)
                refused.append(f"{bundle.name}: {exc}")
                log.warning("bundle_not_indexed", bundle=bundle.name, reason=str(exc))
        write_atomic(path, render(entries))
    return entries, refused

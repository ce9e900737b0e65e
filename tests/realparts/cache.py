"""Content-keyed cache directories for expensive results (archives, module builds).

``cached_dir(kind, key, produce)`` returns ``<cache>/<kind>/<key>/``, calling
``produce(tmp)`` to fill it only when it is not there yet. Concurrent callers
of the same key wait on a per-key flock; the result appears by an atomic
rename, so a killed producer leaves nothing that looks finished. Keys come
from ``key(...)`` over whatever determines the result: ``content_hash`` of
source trees, package versions, flags. Set ``NDI_REALPARTS_NO_CACHE=1`` to
redo every result (the new one replaces the old). Results unused for
MAX_IDLE_DAYS are deleted when a new one of their kind is made: every change
to the stand-in makes new archives and builds, and each is 100-300 MB.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.realparts import provision

MAX_IDLE_DAYS = 14
USED = ".used"  # touched on every hit: the entry's last use


def key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _walk(root: Path, exclude: tuple[str, ...]) -> list[Path]:
    if not root.is_dir():
        return [root]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude)
        out += [Path(dirpath, f) for f in sorted(filenames) if f not in exclude]
    return out


def content_hash(root: Path, exclude: tuple[str, ...] = ()) -> str:
    """SHA-256 of a file, or of a tree: every file's relative path, mode and content
    (a symlink: its target). Names in exclude are skipped at any depth.

    Memoized by a signature of the stat data, so content seen before costs a walk
    instead of a read of every byte (the 535 trees are 270 MB, its .run 117 MB)."""
    files = _walk(root, exclude)
    sig = key(str(root), exclude, [(str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in files])
    memo = provision.CACHE_ROOT / "hashes" / sig
    if memo.exists():
        return memo.read_text().strip()
    if not root.is_dir():
        digest = file_hash(root)
    else:
        h = hashlib.sha256()
        for p in files:
            st = p.lstat()
            data = os.readlink(p) if p.is_symlink() else file_hash(p)
            h.update(f"{p.relative_to(root)}\0{st.st_mode & 0o7777:o}\0{data}\n".encode())
        digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(digest + "\n")
    return digest


def _idle_since(d: Path) -> float:
    stamp = d / USED
    return stamp.stat().st_mtime if stamp.exists() else d.stat().st_mtime


def _evict_idle(root: Path) -> None:
    """Delete entries idle for MAX_IDLE_DAYS; skip any whose lock someone holds."""
    limit = time.time() - MAX_IDLE_DAYS * 86400
    for d in root.iterdir():
        if d.name.startswith(".") or not d.is_dir() or _idle_since(d) >= limit:
            continue
        with open(root / f".{d.name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            if d.exists() and _idle_since(d) < limit:
                shutil.rmtree(d)


def cached_dir(root: Path | str, k: str, produce: Callable[[Path], None]) -> Path:
    """<root>/<k>/, made once by produce(an empty dir). root: a path, or a name under the cache."""
    root = provision.CACHE_ROOT / root if isinstance(root, str) else root
    final = root / k
    root.mkdir(parents=True, exist_ok=True)
    with provision.locked(root / f".{k}.lock"):
        if final.exists() and os.environ.get("NDI_REALPARTS_NO_CACHE") != "1":
            (final / USED).touch()
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{k}-", dir=root))
        try:
            produce(work)
            if final.exists():
                shutil.rmtree(final)
            os.rename(work, final)
            (final / USED).touch()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _evict_idle(root)
    return final

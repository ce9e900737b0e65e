"""The ``.cache`` record: what is installed, for which kernel/build, and its file hashes.

Shell-style lines, as GKE's installers write them, so a node cached by them is
recognised (``CACHE_BUILD_ID=`` / ``CACHE_KERNEL_VERSION=`` and
``CACHE_NVIDIA_DRIVER_VERSION=``; cos-gpu-installer v2's ``BUILD_ID=``,
``DRIVER_VERSION=`` and ``KERNEL_OPEN=`` too) and a GKE installer sourcing ours still
parses it. ``read`` is the one reader of every one of them. Which fields key an install
on a node is the distro's to say (Distro.node_key).
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path

import structlog

from installer.base.dataclass import dataclass
from installer.base.fsutil import (
    UnreadableFile,
    open_beneath,
    read_regular,
    sha256_file,
    sha256_stream,
    write_record,
)
from installer.base.kinds import OPEN, PROPRIETARY, ModuleType
from installer.host.installdir import check_layout_path
from installer.host.osinfo import parse_env_file
from installer.records.cachekey import CacheKey as CacheKey  # re-exported: the record and its key
from installer.records.cachekey import ModuleSource as ModuleSource

log = structlog.get_logger(__name__)

CACHE_FORMAT = "2"
MAX_BYTES = 1 << 20  # hashes of a few dozen files: a few KB
# A hashed file larger than this makes the record unusable (a miss): the largest real
# ones (nvidia.ko with debug info, libcuda.so) are ~100-200 MB, and hashing 1 GiB takes
# ~2 s with the host lock held. A sparse 1 TiB file named in a record took over an hour.
MAX_FILE_BYTES = 1 << 30
MAX_HASHED_BYTES = 4 << 30  # all of a record's files together (a real install: ~0.3 GB)
# A record without hashes (written by GKE's installers) is trusted only if these exist.
REQUIRED_FILES = ("drivers/nvidia.ko", "bin/nvidia-smi", "lib64/libnvidia-ml.so.1")
# The links the loader follows to a hashed file: the CUDA check and NVML load these names
# (cuda_check.LIBCUDA; nvidia-smi's DT_NEEDED). Each must stay a link to a file whose digest
# the record holds: a planted .so in its place would run as root at the next cache hit.
LOADER_LINKS = ("lib64/libcuda.so.1", "lib64/libnvidia-ml.so.1")
LINK_DIRS = ("lib64", "bin")  # every link here is recorded with its target (soname links)
# A link target the record can hold: the jail chose it, and the record is shell-quoted text.
_SAFE_TARGET = re.compile(r"[A-Za-z0-9._+-][A-Za-z0-9._+/-]*")


# CACHE_FLAVOR, the record's one word for (source, module type): the spelling every
# record written so far uses, so older installers and ours read each other's records.
_FLAVORS: dict[tuple[ModuleSource, ModuleType], str] = {
    (ModuleSource.PREBUILT, OPEN): "prebuilt-open",
    (ModuleSource.PRECOMPILED, PROPRIETARY): "precompiled-signed",
    (ModuleSource.COMPILED, OPEN): "compiled-open",
    (ModuleSource.COMPILED, PROPRIETARY): "compiled-proprietary",
}
_FROM_FLAVOR = {word: pair for pair, word in _FLAVORS.items()}

# cos-gpu-installer v2 (cos/tools src/cmd/cos_gpu_installer/internal/installer/cache.go
# L14-20, L73-85) writes BUILD_ID=, DRIVER_VERSION= and, for the open modules,
# KERNEL_OPEN=Y. Its open modules come only as the build's signed prebuilt ones, its
# proprietary ones as Google's precompiled .run.
V2_KERNEL_OPEN_KEY = "KERNEL_OPEN"


def _modules_of(f: Mapping[str, str]) -> tuple[ModuleSource | None, ModuleType | None]:
    """(source, module type) a record names: ours in CACHE_FLAVOR, v2's by its keys."""
    if "CACHE_FLAVOR" in f:
        return _FROM_FLAVOR.get(f["CACHE_FLAVOR"], (None, None))
    if "BUILD_ID" in f:
        if f.get(V2_KERNEL_OPEN_KEY) == "Y":
            return ModuleSource.PREBUILT, OPEN
        return ModuleSource.PRECOMPILED, PROPRIETARY
    return None, None


def stat_signature(path: Path) -> tuple[int, int, int, int]:
    return _signature(os.stat(path))


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    """(size, mtime_ns, ctime_ns, inode): what changes when a file is written or replaced."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


@dataclass(frozen=True)
class CacheRecord:
    driver_version: str | None
    kernel_release: str | None
    build_id: str | None
    source: ModuleSource | None
    module_type: ModuleType | None
    file_hashes: dict[str, str] = field(default_factory=dict)
    # Every link under LINK_DIRS when written, rel -> its target; None: a record written
    # before links were recorded (only LOADER_LINKS are then checked).
    file_links: dict[str, str] | None = None
    fields: dict[str, str] = field(default_factory=dict)
    # The stat signature of each hashed file when the record was written, and the
    # record file's own mtime (set by read()): see check_files' fast path.
    file_stats: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    written_ns: int | None = None

    @classmethod
    def parse(cls, text: str) -> CacheRecord:
        f = parse_env_file(text)
        hashes = {}
        for item in f.get("CACHE_FILE_SHA256", "").split():
            rel, _, digest = item.rpartition(":")
            if rel and digest:
                hashes[rel] = digest
        stats: dict[str, tuple[int, int, int, int]] = {}
        for item in f.get("CACHE_FILE_STAT", "").split():
            rel, *numbers = item.rsplit(":", 4)
            if len(numbers) == 4 and rel and all(p.isdigit() for p in numbers):
                size, mtime_ns, ctime_ns, inode = map(int, numbers)
                stats[rel] = (size, mtime_ns, ctime_ns, inode)
        links = None
        if "CACHE_FILE_LINKS" in f:
            links = dict(item.partition(":")[::2] for item in f["CACHE_FILE_LINKS"].split())
        source, module_type = _modules_of(f)
        return cls(
            file_links=links,
            driver_version=f.get("CACHE_NVIDIA_DRIVER_VERSION") or f.get("DRIVER_VERSION"),
            kernel_release=f.get("CACHE_KERNEL_VERSION"),
            build_id=f.get("CACHE_BUILD_ID") or f.get("BUILD_ID"),
            source=source,
            module_type=module_type,
            file_hashes=hashes,
            fields=f,
            file_stats=stats,
        )

    def mismatch(self, key: CacheKey) -> str | None:
        """Why this record does not describe ``key`` (None when it does)."""
        if self.driver_version != key.driver_version:
            return f"cached driver {self.driver_version}, want {key.driver_version}"
        if key.build_id is not None and self.build_id != key.build_id:
            return f"cached for build {self.build_id}, the node runs build {key.build_id}"
        if key.kernel_release is not None and self.kernel_release != key.kernel_release:
            return f"cached for kernel {self.kernel_release}, the node runs kernel {key.kernel_release}"
        if "CACHE_FLAVOR" in self.fields and self.source is None:
            return f"cached modules of an unknown kind ({self.fields['CACHE_FLAVOR']!r})"
        if key.source and self.source and self.source != key.source:
            return f"cached {self.source.value} modules, want {key.source.value}"
        if key.module_type and self.module_type and self.module_type != key.module_type:
            return f"cached {self.module_type} modules, want {key.module_type}"
        return None

    def describe_modules(self) -> str:
        """E.g. "precompiled proprietary modules"."""
        if self.source is None:
            return "modules of an unrecorded kind"
        return f"{self.source.value} {self.module_type} modules"


def hashed_files(install_dir: Path) -> list[str]:
    """Files whose hashes the record keeps: every module and the libraries tools load."""
    rels = sorted(p.relative_to(install_dir).as_posix() for p in install_dir.glob("drivers/*.ko"))
    for pattern in ("lib64/libnvidia-ml.so.*.*", "lib64/libcuda.so.*.*", "bin/nvidia-smi"):
        rels += sorted(
            p.relative_to(install_dir).as_posix()
            for p in install_dir.glob(pattern)
            if p.is_file() and not p.is_symlink()
        )
    return rels


def links(install_dir: Path) -> dict[str, str]:
    """Every link under LINK_DIRS, rel -> target (those a record can hold)."""
    found = {}
    for top in LINK_DIRS:
        for path in sorted((install_dir / top).rglob("*")):
            if path.is_symlink():
                rel, target = path.relative_to(install_dir).as_posix(), os.readlink(path)
                if _SAFE_TARGET.fullmatch(rel) and _SAFE_TARGET.fullmatch(target):
                    found[rel] = target
    return found


def _read_link(install_dir: Path, rel: str) -> str | None:
    """The target of the link ``rel`` (no link followed on the way); None when ``rel`` is
    absent, OSError(EINVAL) when it is not a link."""
    parent, _, name = rel.rpartition("/")
    try:
        fd = open_beneath(install_dir, parent)
    except FileNotFoundError:
        return None
    try:
        return os.readlink(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def check_links(record: CacheRecord, install_dir: Path) -> str | None:
    """Why the links the loader follows cannot be trusted (None when they can): each
    recorded link still leads where it did, no link was added, and LOADER_LINKS lead to a
    file the record hashes."""
    recorded = record.file_links or {}
    wanted = {**{rel: "" for rel in LOADER_LINKS}, **recorded}
    for rel, target in wanted.items():
        try:
            check_layout_path(rel, "link entry")
            now = _read_link(install_dir, rel)
        except ValueError as exc:
            return f"the record is unusable: {exc}"
        except OSError as exc:
            what = "is no longer a link" if exc.errno == errno.EINVAL else "cannot be read"
            return f"{rel} {what}" if exc.errno != errno.ELOOP else f"{rel} lies under a link"
        if now is None:
            if rel in recorded:
                return f"{rel} is missing"
            continue
        if target and now != target:
            return f"{rel} now leads to {now!r}, not {target!r}"
        if rel in LOADER_LINKS and posixpath.join(posixpath.dirname(rel), now) not in (
                record.file_hashes):
            return f"{rel} leads to {now!r}, a file the record does not hash"
    if record.file_links is not None and (added := set(links(install_dir)) - set(recorded)):
        return f"{sorted(added)[0]} is a link the record does not name"
    return None


def read(cache_file: Path) -> CacheRecord | None:
    """The record, or None when there is none or it is unusable (a FIFO, a device, a
    directory, a huge file, a symlink loop: logged, and the next install replaces it)."""
    try:
        data, st = read_regular(cache_file, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (UnreadableFile, OSError) as exc:  # OSError: a symlink loop (ELOOP), EACCES...
        reason = exc.reason if isinstance(exc, UnreadableFile) else f"cannot be read: {exc.strerror}"
        log.warning("cache_record_unusable", path=str(cache_file), reason=f"it {reason}",
                    hint="treated as no cache: a fresh install replaces it")
        return None
    return replace(CacheRecord.parse(data.decode(errors="replace")), written_ns=st.st_mtime_ns)


def _unchanged(record: CacheRecord, rel: str, st: os.stat_result) -> bool:
    """True when ``st`` provably still is the file that was hashed (no need to re-hash).

    Its size, mtime, ctime and inode must equal those recorded, and both times
    must be strictly older than the record file's mtime (same filesystem, same
    clock granularity). A later write or rename sets the ctime to at least that
    mtime, so it cannot go unnoticed; a file changed within the same clock tick
    as the record ("racily clean", as git calls it) is hashed instead.
    """
    recorded = record.file_stats.get(rel)
    if recorded is None or record.written_ns is None:
        return False
    _size, mtime_ns, ctime_ns, _ino = recorded
    if mtime_ns >= record.written_ns or ctime_ns >= record.written_ns:
        return False
    return _signature(st) == recorded


def check_files(record: CacheRecord, install_dir: Path) -> str | None:
    """Why the cached files cannot be trusted (None when they can)."""
    if not record.file_hashes:
        for rel in REQUIRED_FILES:
            if not (install_dir / rel).exists():
                return f"{rel} is missing"
        return None
    if (why := check_links(record, install_dir)) is not None:
        return why
    budget = MAX_HASHED_BYTES
    for rel, digest in record.file_hashes.items():
        # The record is hostile input too: only the install's own files are hashed, never
        # an absolute path, a '..', or anything through a symlink.
        try:
            check_layout_path(rel, "hash entry")
        except ValueError as exc:
            return f"the record is unusable: {exc}"
        try:
            fd = open_beneath(install_dir, rel)
        except FileNotFoundError:
            return f"{rel} is missing"
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return (f"the record is unusable: hash entry {rel!r} is a symlink or lies "
                        "under one (or under a file)")
            return f"{rel} cannot be read: {exc.strerror}"
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return f"{rel} is not a regular file"
            if _unchanged(record, rel, st):
                continue  # hashing a 100 MB nvidia.ko costs ~0.6 s per boot; stat costs ~20 us
            if st.st_size > MAX_FILE_BYTES:
                return (f"the record is unusable: {rel} is {st.st_size} bytes, more than any "
                        f"driver file (at most {MAX_FILE_BYTES})")
            budget -= st.st_size
            if budget < 0:
                return f"the record is unusable: its files add up to more than {MAX_HASHED_BYTES} bytes"
            if sha256_stream(f) != digest:
                return f"{rel} has changed since it was installed"
    return None


def write(cache_file: Path, key: CacheKey, install_dir: Path, installer_version: str,
          known: Mapping[str, tuple[str, int]] | None = None) -> None:
    """``known``: rel -> (sha256, size) already verified against these very files (a
    bundle's manifest, which the extracted tree was checked to equal): used instead of
    reading the file again when the size still agrees."""
    rels = hashed_files(install_dir)
    # Stat before hashing: a change while hashing then shows as a stat mismatch.
    signatures = {rel: stat_signature(install_dir / rel) for rel in rels}
    stats = " ".join(f"{rel}:{':'.join(map(str, sig))}" for rel, sig in signatures.items())
    known = known or {}

    def digest(rel: str) -> str:
        sha, size = known.get(rel, ("", -1))
        return sha if size == signatures[rel][0] else sha256_file(install_dir / rel)

    hashes = " ".join(f"{rel}:{digest(rel)}" for rel in rels)
    linked = " ".join(f"{rel}:{target}" for rel, target in links(install_dir).items())
    flavor = _FLAVORS[(key.source or ModuleSource.COMPILED, key.module_type or PROPRIETARY)]
    # No comment line: cos-gpu-installer v2's reader rejects lines without '='.
    lines = [
        f"CACHE_WRITTEN_BY=nvidia-driver-installer-{installer_version}",
        f"CACHE_FORMAT={CACHE_FORMAT}",
    ]
    if key.build_id:
        lines.append(f"CACHE_BUILD_ID={key.build_id}")
    if key.kernel_release:
        lines.append(f"CACHE_KERNEL_VERSION={key.kernel_release}")
    lines += [
        f"CACHE_NVIDIA_DRIVER_VERSION={key.driver_version}",
        f"CACHE_FLAVOR={flavor}",
        f"CACHE_INSTALLED_AT={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"CACHE_FILE_SHA256='{hashes}'",
        f"CACHE_FILE_STAT='{stats}'",
        f"CACHE_FILE_LINKS='{linked}'",
        *key.compat_lines,
    ]
    write_record(cache_file, "\n".join(lines) + "\n")

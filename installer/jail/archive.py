"""Safe extraction of tar archives we did not make (COS kernel headers, toolchain, modules).

``extract()`` unpacks a ``.tar``, ``.tgz``, ``.tar.xz``, ``.tar.bz2`` or
``.tar.zst`` -- a file, or a stream read once front to back (tarfile's ``r|``
mode, e.g. a download as it arrives); the compression is told by its magic
bytes, not by a name -- into a fresh
directory next to the target and renames it into place only when every member
was extracted, so the target is either absent, the previous tree, or the
complete new one. Each regular file's sha256 is computed while it is written
(``ExtractResult.hashes``), so a caller checking the tree need not read it back.
``head`` names a first member to be handed to a check before anything else is
extracted (a bundle's manifest: a bundle for another kernel costs one small read).

An archive member is refused (:class:`IntegrityError`,
exit 6) and nothing is left behind when it:

- has an absolute name, or a ``..`` component, or a NUL byte;
- is a symlink whose target resolves outside the extraction root (absolute
  targets included), or a hard link to anything but a regular file already
  extracted inside the root;
- is a character or block device, a FIFO, or any other special file;
- would be written through a symlink that leads outside the root (checked
  with the tree as it is on disk at that moment, so a chain of links created
  by earlier members is followed, not just the member's own name);
- replaces a directory with a file, or the archive is corrupt or truncated.

Only regular files, directories, symlinks and hard links are created. Owners
are not restored and setuid/setgid/sticky bits are dropped; file modes keep
their rwx bits. After the last member every symlink in the tree is checked
again (a later member can change what an earlier link resolves to).
Of the extended attributes recorded in PAX headers (``SCHILY.xattr.*``) only
``security.ima`` (the signatures of COS prebuilt firmware) is applied, when
``keep_xattrs`` is set: anything else, ``security.capability`` above all,
would let an archive grant privileges to a file on the host.

Limits, so a small hostile archive cannot exhaust memory or disk: a long-name
or PAX header larger than ``MAX_HEADER_BYTES`` (tarfile would read it whole
into memory), more than ``max_members`` members, more than ``max_bytes`` of
content, a path component over 255 bytes or a path over 4095, a member path or
symlink target more than ``MAX_DEPTH`` components deep, or an extraction still
running after ``deadline_s`` -- all exit 6. A disk that fills up while extracting
is exit 11 (``DiskSpaceError``).

Each directory is made and checked once (``_Extractor.dirs``): resolving every
member's parents again cost ~76 ms a member 800 deep (a 5 MB archive: hours).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import DiskSpaceError, IntegrityError
from installer.base.fsutil import remove_tree
from installer.jail.tarstream import (
    CORRUPT,
    MAX_TRAILING_BYTES,
    Refused,
    StreamTar,
    UnreadableArchive,
    first_member,
    open_archive,
)

log = structlog.get_logger(__name__)

COPY_CHUNK = 1 << 20
# Tar bomb guards: no real headers/toolchain/modules archive comes near these.
DEFAULT_MAX_BYTES = 32 << 30
DEFAULT_MAX_MEMBERS = 500_000
NAME_MAX, PATH_MAX = 255, 4095
# Real trees are shallow: a Debian linux-headers tree is 7 deep below its top dir (10 in
# COS's kernel-headers.tgz, under usr/src/linux-headers-<release>/).
MAX_DEPTH = 64
# A backstop: with depth and member counts bounded, a real toolchain or bundle extracts
# in well under a minute; a pathological archive must not hold the host lock for hours.
DEFAULT_DEADLINE_S = 1200.0
_XATTR_PREFIX = "SCHILY.xattr."
# The only xattr an archive may set: IMA signatures of COS firmware. Never
# security.capability (file capabilities: root for whoever runs the file),
# trusted.*, or anything else an attacker could use.
KEPT_XATTRS = frozenset({"security.ima"})


@dataclass
class ExtractResult:
    root: Path
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    # The sha256 of every regular file in the tree, by its real path relative to the root
    # (a file written through a linked directory is listed where it really is).
    hashes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Head:
    """A first member the caller checks before the rest is extracted: it must be the
    regular file ``name`` of at most ``max_bytes``; ``check`` gets its content and raises
    to stop, or returns how many bytes of content the rest may have (a bundle's manifest
    declares them), None for the extractor's own bound. It is not written to the tree."""

    name: str
    max_bytes: int
    check: Callable[[bytes], int | None]


class _Overdue(Exception):
    """The extraction passed its deadline; turned into an IntegrityError."""


def _clean_name(name: str) -> PurePosixPath:
    """The member's path relative to the root; refuse anything that could escape it."""
    if "\0" in name:
        raise Refused("a NUL byte in its name")
    if name.startswith("/") or name.startswith("\\"):
        raise Refused("an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Refused("a '..' path component")
    if len(parts) > MAX_DEPTH:  # before any mkdir: pathlib's parents=True recursed per level
        raise Refused(f"a path {len(parts)} directories deep (at most {MAX_DEPTH})")
    if len(name.encode(errors="surrogateescape")) > PATH_MAX or any(
            len(p.encode(errors="surrogateescape")) > NAME_MAX for p in parts):
        raise Refused("a path too long for the filesystem")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _inside(root_real: str, path: str) -> bool:
    return path == root_real or path.startswith(root_real + os.sep)


def _real(path: str) -> str:
    return os.path.realpath(path)


def _copy_hashing(src: IO[bytes], out: IO[bytes]) -> str:
    """Copy ``src`` to ``out``; the sha256 of what was written (hash once, no re-read)."""
    hasher = hashlib.sha256()
    while chunk := src.read(COPY_CHUNK):
        hasher.update(chunk)
        out.write(chunk)
    return hasher.hexdigest()


class _Extractor:
    def __init__(self, tar: tarfile.TarFile, root: Path, *, keep_xattrs: bool,
                 exclude: Callable[[str], bool] | None, max_bytes: int,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        self.tar = tar
        self.root_real = _real(str(root))
        self.root = Path(self.root_real)  # members' real paths are under it
        self.keep_xattrs = keep_xattrs
        self.exclude = exclude
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.members = 0
        self.result = ExtractResult(root)
        self.symlinks: list[tuple[str, Path]] = []
        self.dir_modes: list[tuple[Path, int]] = []
        self.excluded: set[str] = set()
        # Real paths of directories (not links) inside the root, made or checked: a
        # directory is never replaced later (_clear refuses), so these stay safe.
        self.dirs: set[str] = {self.root_real}

    # -- checks against the tree as it is on disk now

    def _make_parents(self, dest: Path) -> Path:
        """Make ``dest``'s missing parents one at a time; returns ``dest`` with its parent
        resolved (real, inside the root). A symlink on the way is followed only to a
        directory inside the root (checked with the tree as it is on disk now)."""
        current = self.root_real
        for part in dest.parent.relative_to(self.root).parts:
            path = os.path.join(current, part)
            if path not in self.dirs:
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    os.mkdir(path)
                else:
                    if stat.S_ISLNK(st.st_mode):
                        path = _real(path)
                        if not _inside(self.root_real, path):
                            raise Refused("a path that leads outside the target through a "
                                           "symlink")
                        if not os.path.isdir(path):
                            raise Refused("a path through a symlink to a non-directory")
                    elif not stat.S_ISDIR(st.st_mode):
                        raise Refused("a path through a file")
                self.dirs.add(path)
            current = path
        return Path(current, dest.name)

    def _rel(self, dest: Path | str) -> str:
        return Path(dest).relative_to(self.root).as_posix()

    def _clear(self, dest: Path, *, for_dir: bool = False) -> None:
        """Remove what a member replaces (tar semantics); never a directory by a file."""
        self.result.hashes.pop(self._rel(dest), None)
        if dest.is_symlink():
            dest.unlink()
        elif dest.is_dir():
            if not for_dir:
                raise Refused("a non-directory member replacing a directory")
        elif dest.exists():
            if for_dir:
                raise Refused("a directory member replacing a file")
            dest.unlink()

    # -- members

    def member(self, info: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise Refused(f"more than {self.max_members} members")
        rel = _clean_name(info.name)
        if self.exclude is not None and rel != PurePosixPath(".") and self.exclude(str(rel)):
            self.excluded.add(str(rel))
            return
        if info.isfifo():
            raise Refused("a FIFO")
        if info.ischr() or info.isblk():
            raise Refused("a device file")
        dest = self.root / rel
        if info.isdir():
            self._dir(dest, info)
        elif info.issym():
            self._symlink(dest, rel, info)
        elif info.islnk():
            self._hardlink(dest, rel, info)
        elif info.isreg():
            self._file(dest, info)
        else:
            raise Refused(f"an unsupported member type {info.type!r}")

    def _dir(self, dest: Path, info: tarfile.TarInfo) -> None:
        if dest == self.root:
            return
        dest = self._make_parents(dest)
        self._clear(dest, for_dir=True)  # a link there goes: the dir is made in its place
        dest.mkdir(exist_ok=True)
        self.dirs.add(str(dest))
        # Applied at the end: a read-only dir must still receive its members.
        self.dir_modes.append((dest, (info.mode & 0o777) | 0o700))
        self.result.dirs += 1

    def _symlink(self, dest: Path, rel: PurePosixPath, info: tarfile.TarInfo) -> None:
        target = info.linkname
        if not target or "\0" in target:
            raise Refused("a symlink with an empty or invalid target")
        if target.startswith("/"):
            raise Refused(f"a symlink to the absolute path {target!r}")
        if target.count("/") >= MAX_DEPTH:
            raise Refused(f"a symlink target more than {MAX_DEPTH} components long")
        dest = self._make_parents(dest)
        resolved = _real(os.path.join(dest.parent, target))
        if not _inside(self.root_real, resolved):
            raise Refused(f"a symlink pointing outside the target ({rel} -> {target})")
        self._clear(dest)
        os.symlink(target, dest)
        self.symlinks.append((target, dest))
        self.result.links += 1

    def _hardlink(self, dest: Path, rel: PurePosixPath, info: tarfile.TarInfo) -> None:
        try:
            src_rel = _clean_name(info.linkname)
        except Refused as exc:
            raise Refused(f"a hard link to {info.linkname!r} ({exc})") from None
        if str(src_rel) in self.excluded:
            self.excluded.add(str(rel))
            return
        src = self.root / src_rel
        src_real = _real(str(src))
        if not _inside(self.root_real, src_real):
            raise Refused(f"a hard link pointing outside the target ({rel} -> {info.linkname})")
        try:
            st = os.lstat(src_real)
        except FileNotFoundError:
            raise Refused(f"a hard link to {info.linkname!r}, not extracted before it") from None
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"a hard link to {info.linkname!r}, which is not a regular file")
        dest = self._make_parents(dest)
        self._clear(dest)
        os.link(src_real, dest, follow_symlinks=False)
        digest = self.result.hashes.get(self._rel(src_real))
        if digest is not None:
            self.result.hashes[self._rel(dest)] = digest
        self.result.links += 1

    def _file(self, dest: Path, info: tarfile.TarInfo) -> None:
        self.result.bytes += info.size
        if self.result.bytes > self.max_bytes:
            raise Refused(f"more than {self.max_bytes} bytes of content")
        dest = self._make_parents(dest)
        self._clear(dest)
        src = self.tar.extractfile(info)
        if src is None:  # cannot happen for a regular file
            raise Refused("an unreadable file member")
        # O_EXCL|O_NOFOLLOW: never write through a link created in between.
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, src:
            self.result.hashes[self._rel(dest)] = _copy_hashing(src, out)
        os.chmod(dest, info.mode & 0o777)
        os.utime(dest, (info.mtime, info.mtime), follow_symlinks=False)
        if self.keep_xattrs:
            self._xattrs(dest, info)
        self.result.files += 1

    def _xattrs(self, dest: Path, info: tarfile.TarInfo) -> None:
        for key, value in info.pax_headers.items():
            if not key.startswith(_XATTR_PREFIX):
                continue
            name = key[len(_XATTR_PREFIX):]
            if name not in KEPT_XATTRS:
                log.warning("xattr_dropped", path=str(dest.relative_to(self.root)), xattr=name,
                            reason="only security.ima is applied from archives")
                continue
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
            try:
                os.setxattr(dest, name, raw, follow_symlinks=False)
            except OSError as exc:
                log.warning("xattr_not_set", path=str(dest), xattr=name, error=str(exc))

    def finish(self) -> None:
        # A later member may have turned a link's path into one that escapes.
        for target, link in self.symlinks:
            if link.is_symlink() and os.readlink(link) == target:
                resolved = _real(os.path.join(_real(str(link.parent)), target))
                if not _inside(self.root_real, resolved):
                    rel = link.relative_to(self.root)
                    raise Refused(f"a symlink pointing outside the target ({rel} -> {target})")
        for path, mode in reversed(self.dir_modes):
            os.chmod(path, mode)
        self.result.skipped = sorted(self.excluded)


def exclude_patterns(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A member filter from shell patterns on the member path (``usr/lib64/rustlib*``)."""
    pats = tuple(patterns)

    def excluded(rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, p + "/*") for p in pats)

    return excluded


def extract(
    archive: Path | BinaryIO,
    target: Path,
    *,
    label: str | None = None,
    head: Head | None = None,
    keep_xattrs: bool = False,
    exclude: Callable[[str], bool] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> ExtractResult:
    """Unpack ``archive`` (a path, or a binary stream read to the archive's end) into
    ``target`` (which must not exist yet); see the module doc.

    Raises IntegrityError (exit 6) for an unsafe member or a corrupt archive, or
    whatever ``head.check`` raises; ``target`` and the temporary directory are then
    left absent.
    """
    target = Path(target)
    shown = str(archive) if isinstance(archive, (str, Path)) else (label or "stream")
    label = label or Path(shown).name
    work = _work_dir(target)
    deadline = time.monotonic() + deadline_s
    where = _Where()
    try:
        with contextlib.ExitStack() as stack:
            tar = open_archive(archive, stack)
            ex = _Extractor(tar, work, keep_xattrs=keep_xattrs, exclude=exclude,
                            max_bytes=max_bytes, max_members=max_members)
            _extract_members(tar, ex, head, deadline, where)
        os.replace(work, target)
    except BaseException as exc:
        remove_tree(work, ignore_errors=True)
        _raise_failure(exc, label, shown, target, where.member, deadline_s)
        raise
    ex.result.root = target
    log.info("archive_extracted", archive=label, target=str(target), files=ex.result.files,
             dirs=ex.result.dirs, links=ex.result.links, mb=round(ex.result.bytes / 1e6, 1),
             skipped=len(ex.result.skipped))
    return ex.result


def _work_dir(target: Path) -> Path:
    """A fresh ``.<target>.extracting`` beside ``target``, renamed to it when complete."""
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"extraction target {target} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = target.with_name(f".{target.name}.extracting")
    if work.exists() or work.is_symlink():
        remove_tree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    return work


@dataclass
class _Where:
    """The member being read when something failed (None: between members)."""

    member: str | None = None


def _extract_members(tar: StreamTar, ex: _Extractor, head: Head | None,
                     deadline: float, where: _Where) -> None:
    if head is not None:
        where.member = head.name
        try:
            data = first_member(tar, head.name, head.max_bytes)
        except UnreadableArchive as exc:
            raise Refused(str(exc).removeprefix("its ")) from None
        ex.members += 1
        where.member = None
        declared = head.check(data)
        if declared is not None:
            ex.max_bytes = min(ex.max_bytes, declared)
    while (info := tar.next()) is not None:
        tar.members.clear()  # tarfile keeps every header otherwise: memory per member
        if time.monotonic() > deadline:
            raise _Overdue(ex.members)
        where.member = info.name
        try:
            ex.member(info)
        except OSError as exc:  # e.g. a link target over PATH_MAX
            if exc.errno != errno.ENAMETOOLONG:
                raise
            raise Refused("a path too long for the filesystem") from None
    where.member = None
    ex.finish()
    if tar.read_ahead is not None:
        tar.read_ahead.drain(MAX_TRAILING_BYTES)


def _raise_failure(exc: BaseException, label: str, shown: str, target: Path,
                   member: str | None, deadline_s: float) -> None:
    """The error an extraction's failure is to the caller (returns when ``exc`` itself
    is to be raised: a real filesystem problem, or anything not about the archive)."""
    if isinstance(exc, Refused):
        where = f" member {member!r}" if member is not None else ""
        raise IntegrityError(
            f"unsafe archive {label}:{where} has {exc}; nothing was extracted",
            hint="the artifact is corrupt or has been tampered with; check its source",
            path=shown,
            member=member,
        ) from None
    if isinstance(exc, _Overdue):
        raise IntegrityError(
            f"unsafe archive {label}: still extracting after {deadline_s:.0f} s ({exc} "
            "members); stopped, nothing was extracted",
            hint="a real archive takes well under a minute: check its source (or, on a very "
            "slow disk, the disk)",
            path=shown,
        ) from None
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskSpaceError(
            f"the disk filled up extracting {label} into {target.parent}",
            hint="free space on the node (or point the install / tools dir elsewhere) "
            "and re-run",
            path=str(target.parent),
        ) from None
    if isinstance(exc, OSError) and not isinstance(exc, EOFError) and exc.errno is not None:
        return  # a real filesystem problem (permissions), not a bad archive
    if isinstance(exc, (*CORRUPT, OSError)):
        raise IntegrityError(
            f"corrupt archive {label}: {exc}",
            hint="the download is damaged or truncated: re-run to fetch it again",
            path=shown,
        ) from exc

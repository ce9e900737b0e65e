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
import gzip
import hashlib
import lzma
import os
import queue
import stat
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import structlog
import zstandard

from installer.errors import DiskSpaceError, IntegrityError
from installer.fsutil import remove_tree

log = structlog.get_logger(__name__)

COPY_CHUNK = 1 << 20
# tarfile's stream reads: its default 10 KB record costs a Python round trip per 10 KB.
STREAM_BUFSIZE = 1 << 20
# zstd frames we write use windows <= 8 MiB (level <= 19); a hostile frame must not make
# the decompressor allocate more than this.
ZSTD_MAX_WINDOW = 1 << 25
# A tar's end is padded to its record size (10 KB for GNU tar); nothing real has more.
MAX_TRAILING_BYTES = 16 << 20
CLOSE_TIMEOUT_S = 300.0
_MAGICS = ((b"\x1f\x8b", "gz"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bz2"),
           (b"\x28\xb5\x2f\xfd", "zst"))
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)
# Tar bomb guards: no real headers/toolchain/modules archive comes near these.
DEFAULT_MAX_BYTES = 32 << 30
DEFAULT_MAX_MEMBERS = 500_000
MAX_HEADER_BYTES = 1 << 20
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
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                 tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


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


class _Refused(Exception):
    """One member is unsafe; turned into an IntegrityError naming the archive."""


class _Overdue(Exception):
    """The extraction passed its deadline; turned into an IntegrityError."""


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long-name or PAX header whole into memory, whatever size its
    header claims (a 3 MB gzip can claim 6 GiB): refuse big ones before the read."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise _Refused(f"a {self.size}-byte extended header (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


class UnreadableArchive(Exception):
    """read_first_member could not give the member asked for: the message says why."""


def read_first_member(archive: Path, name: str, max_bytes: int) -> bytes:
    """The content of a tar archive's first member (any compression extract() reads),
    which must be the regular file ``name`` of at most ``max_bytes``; nothing after it is
    read. Extended headers are bounded as extract() bounds them. Raises UnreadableArchive."""
    try:
        with open(archive, "rb") as raw, open_stream(raw) as tar:
            return _first_member(tar, name, max_bytes)
    except _Refused as exc:
        raise UnreadableArchive(f"it has {exc}") from None
    except (*_CORRUPT, OSError) as exc:
        raise UnreadableArchive(f"it is not a readable tar archive: {exc}") from None


def _first_member(tar: tarfile.TarFile, name: str, max_bytes: int) -> bytes:
    first = tar.next()
    if first is None or first.name != name or not first.isreg():
        raise UnreadableArchive(f"its first member is not {name}")
    if first.size > max_bytes:
        raise UnreadableArchive(f"its {name} is larger than {max_bytes} bytes")
    stream = tar.extractfile(first)
    assert stream is not None  # a regular member
    return stream.read()


class _Prefixed:
    """A stream with the bytes already read off its front put back (for the magic)."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(size)
        if size < 0:
            out, self.head = self.head + self.rest.read(), b""
            return out
        out, self.head = self.head[:size], self.head[size:]
        return out


class _ReadAhead:
    """The decompressor run in its own thread, a few chunks ahead of tarfile: inflating
    (zstd, zlib: both let go of the GIL) then overlaps hashing and writing the files."""

    DEPTH = 4  # chunks of STREAM_BUFSIZE queued: bounded memory

    def __init__(self, inner: BinaryIO) -> None:
        self.queue: queue.Queue[bytes | BaseException | None] = queue.Queue(self.DEPTH)
        self.stop = threading.Event()
        self.chunk, self.offset = b"", 0
        self.eof = False
        self.thread = threading.Thread(target=self._produce, args=(inner,),
                                       name="archive-inflate", daemon=True)
        self.thread.start()

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, inner: BinaryIO) -> None:
        try:
            while chunk := inner.read(STREAM_BUFSIZE):  # bounded output: no bomb in memory
                if not self._put(chunk):
                    return
            self._put(None)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the reader's thread
            self._put(exc)

    def read(self, size: int = -1) -> bytes:
        while self.offset >= len(self.chunk):
            if self.eof:
                return b""
            try:  # the source has deadlines of its own (a download's); this is a backstop
                item = self.queue.get(timeout=CLOSE_TIMEOUT_S)
            except queue.Empty:
                raise EOFError(f"no data for {CLOSE_TIMEOUT_S:.0f} s") from None
            if item is None or isinstance(item, BaseException):
                self.eof = True
                if item is None:
                    return b""
                raise item
            self.chunk, self.offset = item, 0
        begin = self.offset
        self.offset = len(self.chunk) if size < 0 else min(len(self.chunk), begin + size)
        if begin == 0 and self.offset == len(self.chunk):
            return self.chunk  # a whole chunk, as tarfile asks for them: no copy
        return self.chunk[begin:self.offset]

    def drain(self, limit: int) -> None:
        """Decompress to the end (so gzip's CRC and zstd's checksum are checked); refuse
        more than ``limit`` bytes after the archive's end."""
        left = limit
        while chunk := self.read(STREAM_BUFSIZE):
            left -= len(chunk)
            if left < 0:
                raise _Refused(f"more than {limit} bytes after the archive's end")

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        # Bounded by the source: a pipe's writer has its own deadlines, then closes it.
        self.thread.join(CLOSE_TIMEOUT_S)
        if self.thread.is_alive():
            log.warning("archive_inflate_thread_still_running", waited_s=CLOSE_TIMEOUT_S)


@contextlib.contextmanager
def open_stream(fileobj: BinaryIO) -> Iterator[tarfile.TarFile]:
    """A tarfile reading ``fileobj`` once, front to back; gzip, xz, bzip2 and zstd told
    apart by their magic bytes (anything else is read as a plain tar). gzip and zstd
    (bundles) are inflated a few chunks ahead in a thread of their own."""
    head = b""
    while len(head) < 6:  # a pipe may hand out fewer bytes than asked
        more = fileobj.read(6 - len(head))
        if not more:
            break
        head += more
    kind = next((k for magic, k in _MAGICS if head.startswith(magic)), "")
    source: BinaryIO = _Prefixed(head, fileobj)  # type: ignore[assignment]
    ahead = None
    if kind == "zst":
        ahead = _ReadAhead(zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
                           .stream_reader(source, read_size=STREAM_BUFSIZE,
                                          read_across_frames=True, closefd=False))
    elif kind == "gz":
        ahead = _ReadAhead(gzip.GzipFile(fileobj=source, mode="rb"))  # type: ignore[arg-type]
    try:
        with tarfile.open(fileobj=ahead or source, mode="r|" if ahead else f"r|{kind}",
                          tarinfo=_BoundedTarInfo, bufsize=STREAM_BUFSIZE) as tar:
            tar.read_ahead = ahead  # type: ignore[attr-defined]
            yield tar
    finally:
        if ahead is not None:
            ahead.close()


def _clean_name(name: str) -> PurePosixPath:
    """The member's path relative to the root; refuse anything that could escape it."""
    if "\0" in name:
        raise _Refused("a NUL byte in its name")
    if name.startswith("/") or name.startswith("\\"):
        raise _Refused("an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise _Refused("a '..' path component")
    if len(parts) > MAX_DEPTH:  # before any mkdir: pathlib's parents=True recursed per level
        raise _Refused(f"a path {len(parts)} directories deep (at most {MAX_DEPTH})")
    if len(name.encode(errors="surrogateescape")) > PATH_MAX or any(
            len(p.encode(errors="surrogateescape")) > NAME_MAX for p in parts):
        raise _Refused("a path too long for the filesystem")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _inside(root_real: str, path: str) -> bool:
    return path == root_real or path.startswith(root_real + os.sep)


def _real(path: str) -> str:
    return os.path.realpath(path)


def _copy_hashing(src: BinaryIO, out: BinaryIO) -> str:
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
                            raise _Refused("a path that leads outside the target through a "
                                           "symlink")
                        if not os.path.isdir(path):
                            raise _Refused("a path through a symlink to a non-directory")
                    elif not stat.S_ISDIR(st.st_mode):
                        raise _Refused("a path through a file")
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
                raise _Refused("a non-directory member replacing a directory")
        elif dest.exists():
            if for_dir:
                raise _Refused("a directory member replacing a file")
            dest.unlink()

    # -- members

    def member(self, info: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise _Refused(f"more than {self.max_members} members")
        rel = _clean_name(info.name)
        if self.exclude is not None and rel != PurePosixPath(".") and self.exclude(str(rel)):
            self.excluded.add(str(rel))
            return
        if info.isfifo():
            raise _Refused("a FIFO")
        if info.ischr() or info.isblk():
            raise _Refused("a device file")
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
            raise _Refused(f"an unsupported member type {info.type!r}")

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
            raise _Refused("a symlink with an empty or invalid target")
        if target.startswith("/"):
            raise _Refused(f"a symlink to the absolute path {target!r}")
        if target.count("/") >= MAX_DEPTH:
            raise _Refused(f"a symlink target more than {MAX_DEPTH} components long")
        dest = self._make_parents(dest)
        resolved = _real(os.path.join(dest.parent, target))
        if not _inside(self.root_real, resolved):
            raise _Refused(f"a symlink pointing outside the target ({rel} -> {target})")
        self._clear(dest)
        os.symlink(target, dest)
        self.symlinks.append((target, dest))
        self.result.links += 1

    def _hardlink(self, dest: Path, rel: PurePosixPath, info: tarfile.TarInfo) -> None:
        try:
            src_rel = _clean_name(info.linkname)
        except _Refused as exc:
            raise _Refused(f"a hard link to {info.linkname!r} ({exc})") from None
        if str(src_rel) in self.excluded:
            self.excluded.add(str(rel))
            return
        src = self.root / src_rel
        src_real = _real(str(src))
        if not _inside(self.root_real, src_real):
            raise _Refused(f"a hard link pointing outside the target ({rel} -> {info.linkname})")
        try:
            st = os.lstat(src_real)
        except FileNotFoundError:
            raise _Refused(f"a hard link to {info.linkname!r}, not extracted before it") from None
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"a hard link to {info.linkname!r}, which is not a regular file")
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
            raise _Refused(f"more than {self.max_bytes} bytes of content")
        dest = self._make_parents(dest)
        self._clear(dest)
        src = self.tar.extractfile(info)
        if src is None:  # cannot happen for a regular file
            raise _Refused("an unreadable file member")
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
                    raise _Refused(f"a symlink pointing outside the target ({rel} -> {target})")
        for path, mode in reversed(self.dir_modes):
            os.chmod(path, mode)
        self.result.skipped = sorted(self.excluded)


def exclude_patterns(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A member filter from shell patterns on the member path (``usr/lib64/rustlib*``)."""
    pats = tuple(patterns)

    def excluded(rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, p + "/*") for p in pats)

    return excluded


def _open(archive: Path | BinaryIO, stack: contextlib.ExitStack) -> tarfile.TarFile:
    """A file is opened as before zstd (random access: GzipFile checks gzip's CRC) unless
    it is zstd (whose frame checksum the decompressor checks); a stream is read once, its
    integrity the caller's digest (tarfile's stream mode skips gzip's CRC)."""
    if not isinstance(archive, (str, Path)):
        return stack.enter_context(open_stream(archive))
    raw = stack.enter_context(open(archive, "rb"))  # noqa: SIM115
    if raw.read(4) == _MAGICS[-1][0]:
        raw.seek(0)
        return stack.enter_context(open_stream(raw))
    return stack.enter_context(tarfile.open(archive, mode="r:*", tarinfo=_BoundedTarInfo))


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
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"extraction target {target} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = target.with_name(f".{target.name}.extracting")
    if work.exists() or work.is_symlink():
        remove_tree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    member_name = None
    deadline = time.monotonic() + deadline_s
    try:
        with contextlib.ExitStack() as stack:
            tar = _open(archive, stack)
            ex = _Extractor(tar, work, keep_xattrs=keep_xattrs, exclude=exclude,
                            max_bytes=max_bytes, max_members=max_members)
            if head is not None:
                member_name = head.name
                try:
                    data = _first_member(tar, head.name, head.max_bytes)
                except UnreadableArchive as exc:
                    raise _Refused(str(exc).removeprefix("its ")) from None
                ex.members += 1
                member_name = None
                declared = head.check(data)
                if declared is not None:
                    ex.max_bytes = min(ex.max_bytes, declared)
            while (info := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every header otherwise: memory per member
                if time.monotonic() > deadline:
                    raise _Overdue(ex.members)
                member_name = info.name
                try:
                    ex.member(info)
                except OSError as exc:  # e.g. a link target over PATH_MAX
                    if exc.errno != errno.ENAMETOOLONG:
                        raise
                    raise _Refused("a path too long for the filesystem") from None
            member_name = None
            ex.finish()
            if getattr(tar, "read_ahead", None) is not None:
                tar.read_ahead.drain(MAX_TRAILING_BYTES)
        os.replace(work, target)
    except _Refused as exc:
        remove_tree(work, ignore_errors=True)
        where = f" member {member_name!r}" if member_name is not None else ""
        raise IntegrityError(
            f"unsafe archive {label}:{where} has {exc}; nothing was extracted",
            hint="the artifact is corrupt or has been tampered with; check its source",
            path=shown,
            member=member_name,
        ) from None
    except _Overdue as exc:
        remove_tree(work, ignore_errors=True)
        raise IntegrityError(
            f"unsafe archive {label}: still extracting after {deadline_s:.0f} s ({exc} "
            "members); stopped, nothing was extracted",
            hint="a real archive takes well under a minute: check its source (or, on a very "
            "slow disk, the disk)",
            path=shown,
        ) from None
    except (*_CORRUPT, OSError) as exc:
        remove_tree(work, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskSpaceError(
                f"the disk filled up extracting {label} into {target.parent}",
                hint="free space on the node (or point the install / tools dir elsewhere) "
                "and re-run",
                path=str(target.parent),
            ) from None
        if isinstance(exc, OSError) and not isinstance(exc, EOFError) and exc.errno is not None:
            raise  # a real filesystem problem (permissions), not a bad archive
        raise IntegrityError(
            f"corrupt archive {label}: {exc}",
            hint="the download is damaged or truncated: re-run to fetch it again",
            path=shown,
        ) from exc
    except BaseException:
        remove_tree(work, ignore_errors=True)
        raise
    ex.result.root = target
    log.info("archive_extracted", archive=label, target=str(target), files=ex.result.files,
             dirs=ex.result.dirs, links=ex.result.links, mb=round(ex.result.bytes / 1e6, 1),
             skipped=len(ex.result.skipped))
    return ex.result

"""Reading a tar archive we did not make, once, front to back: the compression told by its
magic bytes (gzip, xz, bzip2, zstd), the decompressor a few chunks ahead in its own thread,
extended headers bounded before tarfile reads them into memory. ``archive.extract`` writes
what this reads; ``read_first_member`` reads only the first member (a bundle's manifest).
"""

from __future__ import annotations

import contextlib
import gzip
import lzma
import queue
import tarfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

import structlog

log = structlog.get_logger(__name__)

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
CORRUPT = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)  # zstd's: CorruptZstd
MAX_HEADER_BYTES = 1 << 20
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                 tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class Refused(Exception):
    """One member is unsafe; turned into an IntegrityError naming the archive."""


class BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long-name or PAX header whole into memory, whatever size its
    header claims (a 3 MB gzip can claim 6 GiB): refuse big ones before the read."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise Refused(f"a {self.size}-byte extended header (at most {MAX_HEADER_BYTES})")
        # ignored: _proc_member is tarfile's private hook (every CPython since 2.7), not in typeshed
        member: tarfile.TarInfo = super()._proc_member(tarfile_)  # type: ignore[misc]
        return member


class StreamTar(tarfile.TarFile):
    """An archive as this module opens it: what typeshed leaves out of TarFile
    (``members``, the headers read so far) declared, and for a stream whose
    decompressor runs ahead, that ReadAhead (its end is drained after the last member)."""

    members: list[tarfile.TarInfo]
    read_ahead: ReadAhead | None = None


_STREAM_MODES: dict[str, Literal["r|", "r|xz", "r|bz2"]] = {"": "r|", "xz": "r|xz", "bz2": "r|bz2"}


class CorruptZstd(tarfile.ReadError):
    """The zstd decompressor refused the stream (its ``ZstdError``, said as a tar read error,
    so ``CORRUPT`` names no class of a library only a bundle loads)."""


class _ZstdReader:
    """A zstd stream's decompressed bytes, read by ReadAhead's thread."""

    def __init__(self, source: BinaryIO) -> None:
        # Deferred to the first zstd archive (a bundle): a run that opens none (a cache
        # hit, every boot; a .run install) never loads the binding.
        import zstandard

        self.error = zstandard.ZstdError
        self.reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
            source, read_size=STREAM_BUFSIZE, read_across_frames=True, closefd=False)

    def read(self, size: int = -1) -> bytes:
        try:
            data: bytes = self.reader.read(size)
        except self.error as exc:
            raise CorruptZstd(str(exc)) from exc
        return data


class UnreadableArchive(Exception):
    """read_first_member could not give the member asked for: the message says why."""


def read_first_member(archive: Path, name: str, max_bytes: int) -> bytes:
    """The content of a tar archive's first member (any compression extract() reads),
    which must be the regular file ``name`` of at most ``max_bytes``; nothing after it is
    read. Extended headers are bounded as extract() bounds them. Raises UnreadableArchive."""
    try:
        with open(archive, "rb") as raw, open_stream(raw) as tar:
            return first_member(tar, name, max_bytes)
    except Refused as exc:
        raise UnreadableArchive(f"it has {exc}") from None
    except (*CORRUPT, OSError) as exc:
        raise UnreadableArchive(f"it is not a readable tar archive: {exc}") from None


def first_member(tar: tarfile.TarFile, name: str, max_bytes: int) -> bytes:
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


class ReadAhead:
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
                raise Refused(f"more than {limit} bytes after the archive's end")

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
def open_stream(fileobj: BinaryIO) -> Iterator[StreamTar]:
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
    # ignored: _Prefixed gives read(), all that tarfile and the decompressors call
    source: BinaryIO = _Prefixed(head, fileobj)  # type: ignore[assignment]
    ahead = None
    if kind == "zst":
        # ignored: _ZstdReader gives read(), all that ReadAhead calls
        ahead = ReadAhead(_ZstdReader(source))  # type: ignore[arg-type]
    elif kind == "gz":
        # ignored: a GzipFile reads like the BinaryIO ReadAhead takes (read() only)
        ahead = ReadAhead(gzip.GzipFile(fileobj=source, mode="rb"))  # type: ignore[arg-type]
    try:
        # ignored: tarfile's stream modes ("r|...") only read() their fileobj, which
        # ReadAhead and _Prefixed give; typeshed's _Fileobj asks for a whole file.
        with StreamTar.open(fileobj=ahead or source,  # type: ignore[arg-type]
                            mode="r|" if ahead else _STREAM_MODES[kind],
                            tarinfo=BoundedTarInfo, bufsize=STREAM_BUFSIZE) as tar:
            tar.read_ahead = ahead
            yield tar
    finally:
        if ahead is not None:
            ahead.close()


def open_archive(archive: Path | BinaryIO, stack: contextlib.ExitStack) -> StreamTar:
    """A file is opened as before zstd (random access: GzipFile checks gzip's CRC) unless
    it is zstd (whose frame checksum the decompressor checks); a stream is read once, its
    integrity the caller's digest (tarfile's stream mode skips gzip's CRC)."""
    if not isinstance(archive, (str, Path)):
        return stack.enter_context(open_stream(archive))
    raw = stack.enter_context(open(archive, "rb"))  # noqa: SIM115
    if raw.read(4) == _MAGICS[-1][0]:
        raw.seek(0)
        return stack.enter_context(open_stream(raw))
    return stack.enter_context(StreamTar.open(archive, mode="r:*", tarinfo=BoundedTarInfo))

"""Where a download's bytes go, hashed on the way: a ``.part`` file beside the destination
(``FileSink``) or a pipe to a consumer in a worker thread (``PipeSink``); and the checks
before writing (free space, size bounds)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import structlog

from installer.base.errors import DiskSpaceError, DownloadError
from installer.net.pace import Pacer
from installer.net.retry import TransferLimits

log = structlog.get_logger(__name__)

MB = 1e6
#: Bytes read, hashed and written per step (see bench/download.py for the choice).
CHUNK_SIZE = 1 << 20
#: No artifact comes near this (a .run is ~400 MB, a COS toolchain < 2 GB): a larger
#: size is a broken or hostile server, not a reason to report a full disk.
MAX_DOWNLOAD_BYTES = 32 << 30
#: stream()'s pipe (Linux caps an unprivileged F_SETPIPE_SZ at 1 MiB by default).
PIPE_BYTES = 1 << 20
#: After the body's end the consumer has at most a pipe's worth of input left.
CONSUMER_JOIN_S = 300.0


def mb(n: float) -> float:
    return round(n / MB, 1)


def too_big(size: int, shown: str, what: str) -> DownloadError:
    return DownloadError(
        f"{shown}: the server {what} {size} bytes, more than any artifact can be "
        f"({MAX_DOWNLOAD_BYTES >> 30} GiB); refusing it",
        hint="the server or the URL is wrong (or hostile): check the URL and the mirror",
        url=shown, size=size)


def check_space(directory: Path, needed: int, min_free_bytes: int, *, shown: str) -> None:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # cannot tell; ENOSPC while writing still gets caught
    want = max(needed, 0) + max(min_free_bytes, 0)
    if free < want:
        raise DiskSpaceError(
            f"not enough disk space in {directory} for {shown}: "
            f"need {mb(want)} MB ({mb(needed)} MB download + {mb(min_free_bytes)} MB reserve), "
            f"{mb(free)} MB available",
            hint="free space on the node (or point the install dir elsewhere) and retry",
            path=str(directory),
            url=shown,
            needed_bytes=want,
            available_bytes=free,
        )


def _open_part(path: Path) -> BinaryIO:
    """The temp file, truncated (a stale one from a killed run is discarded)."""
    return open(path, "wb", buffering=0)  # noqa: SIM115 - closed by FileSink


class Sink:
    """The running hash and position of one transfer, kept across attempts; subclasses
    put the bytes somewhere (``_put``) and start over (``_restart``)."""

    def __init__(self, dest: Path, shown: str, limits: TransferLimits | None) -> None:
        self.dest = dest  # free space is checked in dest.parent
        self.shown = shown
        self.pacer = Pacer(limits or TransferLimits(), shown)
        self.hasher = hashlib.sha256()
        self.offset = 0
        self.total: int | None = None
        self.validator: str | None = None
        self.resumed_bytes = 0

    def reset(self) -> None:
        self._restart()
        self.hasher = hashlib.sha256()
        self.offset = 0
        self.total = None
        self.validator = None

    def write(self, chunk: bytes | memoryview) -> None:
        self.hasher.update(chunk)
        self._put(memoryview(chunk))
        self.offset += len(chunk)
        if self.offset > MAX_DOWNLOAD_BYTES:
            raise too_big(self.offset, self.shown, "sent more than")

    def finish(self) -> str:
        """Everything was written: flush, and the sha256 of all of it."""
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def _put(self, view: memoryview) -> None:
        raise NotImplementedError

    def _restart(self) -> None:
        raise NotImplementedError


class FileSink(Sink):
    """Into the temp file ``part``, renamed onto ``dest`` once verified."""

    def __init__(self, part: Path, dest: Path, shown: str,
                 limits: TransferLimits | None = None) -> None:
        super().__init__(dest, shown, limits)
        self.part = part
        self.fh = _open_part(part)

    def _restart(self) -> None:
        self.fh.seek(0)
        self.fh.truncate()

    def _put(self, view: memoryview) -> None:
        try:
            while view:
                n = self.fh.write(view)
                if n is None or n <= 0:  # cannot happen on a regular file; be safe
                    raise OSError(errno.EIO, "short write")
                view = view[n:]
        except OSError as exc:
            raise self._write_error(exc) from exc

    def _write_error(self, exc: OSError) -> Exception:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskSpaceError(
                f"disk full while writing {self.dest} from {self.shown} after {mb(self.offset)} MB",
                hint="free space on the node and retry",
                path=str(self.dest),
                url=self.shown,
            )
        return DownloadError(
            f"cannot write {self.part}: {exc.strerror or exc}", path=str(self.part), url=self.shown
        )

    def finish(self) -> str:
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
        except OSError as exc:
            raise self._write_error(exc) from exc
        self.fh.close()
        return self.hasher.hexdigest()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.fh.close()
        try:
            self.part.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("download_part_not_removed", path=str(self.part), error=str(exc))


class ConsumerFailed(Exception):
    """The stream's consumer raised: carried past the retryer (never retried), then
    re-raised as itself by stream()."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PipeSink(Sink):
    """Into a pipe whose other end ``consume`` reads in a worker thread (one thread per
    restart from 0). The pipe is the bounded buffer between the network and the
    consumer: a slow consumer slows the download down, memory stays flat."""

    def __init__(self, consume: Callable[[BinaryIO], object], discard: Callable[[], None],
                 dest: Path, shown: str, limits: TransferLimits | None) -> None:
        super().__init__(dest, shown, limits)
        self.consume, self.on_discard = consume, discard
        self.thread: threading.Thread | None = None
        self.wfd = -1
        self._discarded = False
        self._start()

    def _start(self) -> None:
        rfd, self.wfd = os.pipe()
        with contextlib.suppress(OSError):  # a bigger pipe: fewer thread switches
            fcntl.fcntl(self.wfd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.result: object = None
        self.error: BaseException | None = None
        reader = os.fdopen(rfd, "rb", buffering=CHUNK_SIZE)
        self.thread = threading.Thread(target=self._consume, args=(reader,),
                                       name="download-consumer", daemon=True)
        self.thread.start()

    def _consume(self, reader: BinaryIO) -> None:
        try:
            self.result = self.consume(reader)
            # What the consumer left (a tar's end padding) still has to pass the digest.
            while reader.read(CHUNK_SIZE):
                pass
        except BaseException as exc:  # noqa: BLE001 - handed to the writer's thread
            self.error = exc
        finally:
            reader.close()  # a writer still writing gets EPIPE, never a hang

    def _stop(self) -> None:
        """End of input for the consumer; wait (bounded) until it has returned."""
        if self.wfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.wfd)
            self.wfd = -1
        if self.thread is not None:
            self.thread.join(CONSUMER_JOIN_S)
            if self.thread.is_alive():
                raise DownloadError(f"{self.shown}: its consumer did not finish within "
                                    f"{CONSUMER_JOIN_S:.0f} s of the end of the body",
                                    url=self.shown)
            self.thread = None

    def _put(self, view: memoryview) -> None:
        try:
            while view:
                view = view[os.write(self.wfd, view):]
        except BrokenPipeError:
            self._stop()  # the consumer stopped reading: it failed (it drains otherwise)
            raise ConsumerFailed(self.error or DownloadError(
                f"{self.shown}: its consumer stopped reading", url=self.shown)) from None

    def _restart(self) -> None:
        self._stop()  # the consumer fails on the cut-off input; that is expected here
        self.on_discard()
        self._start()

    def finish(self) -> str:
        self._stop()
        if self.error is not None:
            raise ConsumerFailed(self.error)
        return self.hasher.hexdigest()

    def discard(self) -> None:
        """Stop the consumer and discard its output; once (a second call does nothing)."""
        if self._discarded:
            return
        self._discarded = True
        try:
            self._stop()
        finally:
            self.on_discard()

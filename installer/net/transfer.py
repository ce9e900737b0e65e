"""One artifact to disk: stream, sha256 while streaming, resume with Range, temp + rename.

``download()`` fetches one artifact to ``dest``:

- ``https://`` (``http://`` only as the session's URL policy allows): a streamed GET
  with ``Accept-Encoding: identity`` and the policy's connect/read timeouts;
  each chunk is hashed and written to ``.<name>.part`` next to ``dest``. When
  the body is complete the file is fsynced, its sha256 checked against
  ``expected_sha256`` (if given) and only then renamed onto ``dest``; the
  directory is fsynced too. So ``dest`` is either absent, the previous file,
  or the complete verified new file -- never a partial one.
- A connection lost mid-body is resumed with ``Range: bytes=<n>-`` (plus
  ``If-Range`` when the server gave a validator). Only a 206 whose
  ``Content-Range`` starts at ``n`` (and agrees on the total) is appended; the
  running sha256 carries on, so nothing is re-read. A 200 to a Range request
  (the server ignores ranges, or the resource changed) restarts cleanly from 0
  on that same response; a 416 or a mismatched ``Content-Range`` restarts
  from 0 with a fresh request.
- Transient failures are retried per :mod:`installer.net.retry`; 401/403/404 and
  other 4xx fail at once with :class:`DownloadError`.
- ``file://`` URLs (air-gapped nodes, pre-staged artifacts) take the same path: the
  session's LocalFSAdapter answers them like a server (a 200 with the file's length,
  a 404 for a missing one), with the same temp + verify + rename.

``stream()`` is the same transfer (retries, resume, limits, digest) without a
file: the body goes through a pipe to a consumer running in a worker thread
(e.g. an extractor), so receiving and unpacking overlap. The digest is
compared when the body ends, before ``stream()`` returns the consumer's
result; a mismatch, a failure of the consumer (its own exception, the transfer
stops), a cancel or a signal calls ``discard`` so the consumer's output goes.
A resume is invisible to the consumer (the bytes stay contiguous); a restart
from 0 discards it and starts a fresh one.

Disk: when the size is known, free space in ``dest``'s directory must cover
what is still to come plus ``min_free_bytes`` (:class:`DiskSpaceError`,
exit 11); ENOSPC while writing is a ``DiskSpaceError`` too. Any failure
removes the ``.part`` file.

Hostile servers (docs/contract.md §5), each exit 5: a body sent with a
``Content-Encoding`` though identity was asked (it would expand without
limit, past the free-space check) is refused; so is a size above
``MAX_DOWNLOAD_BYTES``, announced or streamed. The session's
:class:`~installer.net.retry.TransferLimits` bound the whole download (a deadline)
and each attempt's pace (a minimum rate), so a trickling server cannot hold
the run and the host lock forever. A ``file://`` source must be a regular file
(a FIFO there would hang the run).

URLs are logged and put in error messages with credentials removed
(``https://***@host/path?sig=***``, see :func:`installer.net.policy.redact_url`); a
server's answer is read by :func:`installer.net.session.classify`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import DownloadError, IntegrityError
from installer.base.fsutil import fsync_dir
from installer.base.progress import Progress
from installer.net import retry
from installer.net.integrity import normalize_sha256
from installer.net.policy import redact_url, scrubber
from installer.net.ranges import answer_extent, range_headers
from installer.net.retry import IncompleteBodyError, RetryPolicy
from installer.net.sinks import (
    CHUNK_SIZE,
    MAX_DOWNLOAD_BYTES,
    MB,
    ConsumerFailed,
    FileSink,
    PipeSink,
    Sink,
    check_space,
    too_big,
)

if TYPE_CHECKING:
    import requests

    from installer.net.session import ArtifactSession

log = structlog.get_logger(__name__)

#: Upper bound of one socket read (a TLS record is at most 16 KiB anyway).
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Downloaded:
    """A complete, verified artifact at ``path``.

    ``resumed_bytes``: bytes kept from earlier attempts instead of fetched again
    (the sum of the offsets of accepted Range resumes; 0 without a resume).
    ``url`` is the redacted URL.
    """

    path: Path
    sha256: str
    size: int
    url: str
    resumed_bytes: int
    elapsed_s: float


class Cancelled(Exception):
    """The caller set the download's ``cancel`` event (another job of a parallel fetch
    failed); the download stops at its next chunk or wait."""


def _stream_body(
    resp: requests.Response,
    st: Sink,
    progress: Progress,
    cancel: threading.Event | None,
) -> None:
    """Copy the body into the temp file, CHUNK_SIZE bytes per hash+write.

    Reads with ``read1`` (one socket read at a time) into a reused buffer, and
    writes out whatever arrived even when the read fails, so a resume starts
    exactly where the data ends (``iter_content`` would drop a partial chunk).
    """
    raw = resp.raw
    read1 = getattr(raw, "read1", None)
    if read1 is None:  # pragma: no cover - urllib3 1.x: smaller chunks lose less on a drop
        for chunk in raw.stream(_READ_SIZE, decode_content=False):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            st.pacer.pace(len(chunk))
            st.write(chunk)
            progress.advance(len(chunk))
        return
    buf = bytearray(CHUNK_SIZE)
    view = memoryview(buf)
    while True:
        pos = 0
        eof = False
        try:
            while pos < CHUNK_SIZE:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                data = read1(min(CHUNK_SIZE - pos, _READ_SIZE), decode_content=False)
                if not data:
                    eof = True
                    break
                n = len(data)
                view[pos : pos + n] = data
                pos += n
                st.pacer.pace(n)
        finally:
            if pos:
                st.write(view[:pos])
                progress.advance(pos)
        if eof:
            return


def _attempt(
    session: ArtifactSession,
    url: str,
    st: Sink,
    *,
    policy: RetryPolicy,
    progress: Progress,
    cancel: threading.Event | None,
    min_free_bytes: int,
) -> None:
    """One attempt: one request (two if the server's answer forces a restart from 0)."""
    # Deferred (see _begin); loaded by now: _begin made the session.
    from installer.net.session import classify, refuse_encoding

    st.pacer.begin_attempt()
    for _ in range(2):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        asked = st.offset
        resp = session.get(url, headers=range_headers(st.offset, st.validator), stream=True,
                           timeout=st.pacer.timeout(policy))
        with resp:
            classify(resp, st.shown, session.url_policy,
                     expected=(200, 206, 416) if asked > 0 else (200, 206))
            extent = answer_extent(resp, st, asked)
            if extent is None:
                continue  # restarted from 0: ask again
            refuse_encoding(resp, st.shown)
            _receive(resp, st, *extent, progress=progress, cancel=cancel,
                     min_free_bytes=min_free_bytes)
            return
    raise DownloadError(
        f"{st.shown}: the server answered a plain request with a partial response",
        url=st.shown,
    )


def _receive(resp: requests.Response, st: Sink, total: int | None, body_end: int | None, *,
             progress: Progress, cancel: threading.Event | None, min_free_bytes: int) -> None:
    """The body of an answer whose extent is known, into ``st``; IncompleteBodyError when
    it ends short (the next attempt resumes from there)."""
    shown = st.shown
    if total is not None and total > MAX_DOWNLOAD_BYTES:
        raise too_big(total, shown, "announced")
    st.total = total
    if total is not None:
        check_space(st.dest.parent, total - st.offset, min_free_bytes, shown=shown)
    progress.begin(offset=st.offset, total=total)
    _stream_body(resp, st, progress, cancel)
    if body_end is not None and st.offset < body_end:
        raise IncompleteBodyError(st.offset, body_end)
    if total is not None and st.offset < total:
        # A 206 covering less than the rest: carry on from here next attempt.
        raise IncompleteBodyError(st.offset, total)
    if total is not None and st.offset > total:
        st.reset()
        raise IncompleteBodyError(st.offset, total)


def _finish(st: Sink, expected: str | None, *, label: str, started: float) -> Downloaded:
    actual = st.finish()
    if expected is not None and actual != expected:
        raise IntegrityError(
            f"sha256 mismatch for {st.shown}: expected {expected}, got {actual}",
            hint="the file is corrupt or not the one expected; check the URL and --driver-sha256",
            url=st.shown,
            path=str(st.dest),
            expected_sha256=expected,
            actual_sha256=actual,
        )
    if isinstance(st, FileSink):
        os.replace(st.part, st.dest)
        fsync_dir(st.dest.parent)
    elapsed = time.monotonic() - started
    result = Downloaded(
        path=st.dest,
        sha256=actual,
        size=st.offset,
        url=st.shown,
        resumed_bytes=st.resumed_bytes,
        elapsed_s=elapsed,
    )
    log.info(
        "download_finished",
        url=st.shown,
        label=label,
        path=str(st.dest),
        size=st.offset,
        sha256=actual,
        seconds=round(elapsed, 3),
        mb_per_s=round(st.offset / MB / elapsed, 2) if elapsed > 0 else None,  # size / wall time
        resumed_bytes=st.resumed_bytes,
    )
    return result


def _begin(session: ArtifactSession | None, url: str, dest: Path, label: str | None,
           expected_sha256: str | None) -> tuple[ArtifactSession, str | None, str, str]:
    """(the session, expected sha256, redacted URL, label); ``dest``'s directory made.
    ``session`` None: one with the default policies."""
    # Deferred to the first download: the session module imports requests, which a run that
    # fetches nothing (a cache hit, every boot) must not load (installer/net/__init__.py).
    from installer.net.session import or_default

    session = or_default(session)
    session.url_policy.check(url)
    expected = normalize_sha256(expected_sha256)
    shown = redact_url(url)
    label = label or dest.name
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(
            f"cannot create {dest.parent}: {exc.strerror or exc}", path=str(dest.parent)
        ) from exc
    log.info("download_started", url=shown, label=label, dest=str(dest), expected_sha256=expected)
    return session, expected, shown, label


def _run(
    session: ArtifactSession,
    url: str,
    st: Sink,
    *,
    expected: str | None,
    label: str,
    started: float,
    policy: RetryPolicy | None,
    min_free_bytes: int,
    cancel: threading.Event | None,
) -> Downloaded:
    """The body into ``st`` (through the session: HTTP(S), or file:// by its adapter, with
    retries), then verified; ``st`` discarded on any failure."""
    # Deferred (see _begin); loaded by now: _begin made the session.
    from installer.net.session import request_errors

    policy = policy or session.retry_policy
    progress = Progress(label=label, url=st.shown)
    try:
        scrub = scrubber(url)
        retryer = retry.network_retryer(
            policy,
            url=st.shown,
            redact=scrub,
            sleep_fn=(lambda s: cancel.wait(s)) if cancel is not None else None,
            deadline_at=st.pacer.deadline_at,
        )
        with request_errors(st.shown, scrub):
            retryer(
                _attempt,
                session,
                url,
                st,
                policy=policy,
                progress=progress,
                cancel=cancel,
                min_free_bytes=min_free_bytes,
            )
        progress.close()
        return _finish(st, expected, label=label, started=started)
    except BaseException:
        progress.close()
        st.discard()
        raise


def download(
    session: ArtifactSession | None,
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None = None,
    policy: RetryPolicy | None = None,
    min_free_bytes: int = 0,
    label: str | None = None,
    cancel: threading.Event | None = None,
) -> Downloaded:
    """Fetch ``url`` to ``dest`` (see the module docstring). ``policy=None``: the
    session's (Settings' DOWNLOAD_RETRIES/DOWNLOAD_TIMEOUT, set by the Context). Setting
    ``cancel`` stops
    the download (:class:`Cancelled`) at its next chunk or wait, its temp file removed;
    ``session`` None: one with the default policies."""
    started = time.monotonic()
    dest = Path(dest)
    session, expected, shown, label = _begin(session, url, dest, label, expected_sha256)
    part = dest.with_name(f".{dest.name}.part")
    try:
        st = FileSink(part, dest, shown, session.transfer_limits)
    except OSError as exc:
        raise DownloadError(
            f"cannot create {part}: {exc.strerror or exc}", path=str(part), url=shown
        ) from exc
    return _run(session, url, st, expected=expected, label=label, started=started,
                policy=policy,
                min_free_bytes=min_free_bytes, cancel=cancel)

T = TypeVar("T")


def stream(
    session: ArtifactSession | None,
    url: str,
    consume: Callable[[BinaryIO], T],
    *,
    dest: Path,
    discard: Callable[[], None],
    expected_sha256: str | None = None,
    policy: RetryPolicy | None = None,
    min_free_bytes: int = 0,
    label: str | None = None,
    cancel: threading.Event | None = None,
) -> tuple[Downloaded, T]:
    """Fetch ``url`` into ``consume(stream)``, run in a worker thread (see the module
    docstring): the verified download (``path`` is ``dest``, where the consumer
    writes; its directory's free space is checked) and what ``consume`` returned.

    ``consume`` must read its input to the end of what it needs and return, or raise;
    it is called again on a fresh stream after a restart from 0. ``discard()`` removes
    what it wrote: called on a restart and when the transfer fails for any reason
    (a digest mismatch included) -- it must not fail when there is nothing to remove.
    The consumer's own exception is re-raised as itself."""
    started = time.monotonic()
    dest = Path(dest)
    session, expected, shown, label = _begin(session, url, dest, label, expected_sha256)
    st = PipeSink(consume, discard, dest, shown, session.transfer_limits)
    try:
        got = _run(session, url, st, expected=expected, label=label, started=started,
                   policy=policy,
                   min_free_bytes=min_free_bytes, cancel=cancel)
    except ConsumerFailed as exc:
        raise exc.error from None
    except BaseException:
        # A signal (installer.base.signals) can land after the consumer thread started and
        # before _run's own guard: no consumer may be left running.
        st.discard()
        raise
    # ignored: PipeSink holds what consume() returned as an object; that is this call's T
    return got, st.result  # type: ignore[return-value]

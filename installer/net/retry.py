"""Named retry policies for network I/O (tenacity), transient failures only.

A :class:`RetryPolicy` says how often and how long to try; :func:`network_retryer`
turns one into a ``tenacity.Retrying`` that retries only what can succeed on a
second try:

- connection errors (refused, reset, DNS, proxy), TLS errors other than a
  certificate that does not verify, connect and read timeouts, a body cut
  short (``ChunkedEncodingError``, incomplete body);
- HTTP 429 and 5xx (:class:`TransientHTTPError`), waiting what ``Retry-After``
  asks (delta-seconds or an HTTP-date), capped by ``wait_max``.

Never retried: other 4xx, checksum mismatches, full disks, usage errors, i.e.
every :class:`~installer.base.errors.InstallerError`. Those propagate unchanged.

Between attempts the wait grows exponentially from ``wait_initial`` up to
``wait_max`` with jitter, and an event ``download_retry`` (attempt, wait_s,
cause) is logged. Giving up raises :class:`~installer.base.errors.DownloadError`
saying which limit ran out (attempts or total time) and the last cause.

``total_timeout`` bounds when a *new* attempt may start (no attempt begins,
and no wait is slept, past it); an attempt that is streaming data is not cut
off by it -- a stalled one is cut off by ``read_timeout``.

The operator's knobs, ``DOWNLOAD_RETRIES`` (attempts, instead of
``NETWORK_DEFAULTS.attempts``) and ``DOWNLOAD_TIMEOUT`` (seconds, instead of
``NETWORK_DEFAULTS.total_timeout``), are read by the CLI into Settings
(settings.retry_env: exit 2 on a bad value) and reach every download through the
Context's session (:func:`with_settings`, ``ArtifactSession.retry_policy``); nothing here reads
the environment.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import structlog

from installer.base.dataclass import dataclass
from installer.base.envvars import ENV_RETRIES, ENV_TIMEOUT
from installer.base.errors import DownloadError, InstallerError

if TYPE_CHECKING:
    import tenacity

log = structlog.get_logger(__name__)

__all__ = [
    "NETWORK_DEFAULTS",
    "IncompleteBodyError",
    "RetryPolicy",
    "SlowTransferError",
    "TransferLimits",
    "TransientHTTPError",
    "describe_cause",
    "is_transient",
    "network_retryer",
    "parse_retry_after",
    "with_settings",
]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to try a network operation (all times in seconds)."""

    attempts: int
    wait_initial: float
    wait_max: float
    total_timeout: float
    connect_timeout: float
    read_timeout: float

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        for name in ("wait_initial", "wait_max", "total_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("connect_timeout", "read_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    @property
    def timeout(self) -> tuple[float, float]:
        """``(connect, read)`` as ``requests`` takes it."""
        return (self.connect_timeout, self.read_timeout)


@dataclass(frozen=True)
class TransferLimits:
    """Bounds on one download as a whole, every attempt and wait included.

    ``RetryPolicy`` bounds single operations; a server that trickles a byte
    every few seconds passes every read timeout and would hold the init
    container (and the host lock) forever. ``deadline_s``: the whole download
    ends by then (exit 5). ``min_rate``: bytes per second an attempt must
    average over each ``rate_time_s`` window, or it is cut off and retried
    (0 turns the floor off), as curl's ``--speed-limit``/``--speed-time``.
    """

    deadline_s: float = 3600.0  # a 600 MB COS toolchain at 170 KB/s still makes it
    min_rate: float = 10240.0
    rate_time_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.deadline_s > 0 or self.min_rate < 0 or not self.rate_time_s > 0:
            raise ValueError(f"invalid transfer limits {self}")


class SlowTransferError(Exception):
    """An attempt averaged less than the minimum rate over a whole window (worth a retry:
    another connection may reach a healthier server)."""

    def __init__(self, rate: float, limits: TransferLimits) -> None:
        self.rate = rate
        super().__init__(f"transfer slower than {limits.min_rate:g} B/s for "
                         f"{limits.rate_time_s:g}s ({rate:.0f} B/s; --download-min-rate)")


NETWORK_DEFAULTS = RetryPolicy(
    attempts=6,
    wait_initial=1.0,
    wait_max=30.0,
    total_timeout=600.0,
    connect_timeout=10.0,
    read_timeout=60.0,
)

def with_settings(base: RetryPolicy, attempts: int | None,
                  total_timeout: float | None) -> RetryPolicy:
    """``base`` with the operator's DOWNLOAD_RETRIES / DOWNLOAD_TIMEOUT (Settings) applied."""
    changes: dict[str, Any] = {}
    if attempts is not None:
        changes["attempts"] = attempts
    if total_timeout is not None:
        changes["total_timeout"] = total_timeout
    return replace(base, **changes) if changes else base


# --------------------------------------------------------------------------- errors


class TransientHTTPError(Exception):
    """A 429 or 5xx answer: worth another try, after ``retry_after`` if given."""

    def __init__(self, status: int, reason: str = "", *, retry_after: float | None = None):
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        text = f"HTTP {status}"
        if reason:
            text += f" {reason}"
        if retry_after is not None:
            text += f" (Retry-After {retry_after:g}s)"
        super().__init__(text)


class IncompleteBodyError(Exception):
    """The connection ended before the announced length was received."""

    def __init__(self, received: int, expected: int):
        self.received = received
        self.expected = expected
        super().__init__(f"body ended after {received} of {expected} bytes")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    None when absent or unparseable; never negative.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    # An HTTP-date here is rare (servers send seconds); the email package costs every
    # start-up ~3 ms, so it loads on the first one.
    import email.utils

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def _cert_verify_failure(exc: BaseException) -> bool:
    # ssl (with socket, ~5 ms) loads with requests, the first request's: an error to
    # classify means it is loaded, and a run that makes no request does not pay for it.
    import ssl

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(cur):
            return True
        for arg in getattr(cur, "args", ()):
            if isinstance(arg, BaseException) and id(arg) not in seen and _cert_verify_failure(arg):
                return True
            reason = getattr(arg, "reason", None)
            if isinstance(reason, BaseException) and _cert_verify_failure(reason):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


class _WireErrors(NamedTuple):
    tls: tuple[type[BaseException], ...]  # a TLS failure (retried unless it is the certificate)
    transient: tuple[type[BaseException], ...]  # worth another try
    name_resolution: type[BaseException]  # a host name that did not resolve


@functools.cache
def _wire_errors() -> _WireErrors:
    """requests' and urllib3's exception classes this module tells apart.

    Imported here, not at the module's top: requests loads with the first request
    (installer.net.session), and a run that makes none (a cache hit, every boot) must not
    pay for it; an error of theirs to classify means they are loaded already."""
    import ssl  # as in _cert_verify_failure

    # Deferred: see the docstring.
    import requests
    import urllib3.exceptions

    tls = (requests.exceptions.SSLError, urllib3.exceptions.SSLError, ssl.SSLError)
    transient = (
        requests.exceptions.ConnectionError,  # includes ProxyError, ConnectTimeout
        requests.exceptions.Timeout,
        requests.exceptions.ChunkedEncodingError,
        # Raised by reads from the body (resp.raw) directly:
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.ReadTimeoutError,
        urllib3.exceptions.IncompleteRead,
    )
    return _WireErrors(tls, transient, urllib3.exceptions.NameResolutionError)


def is_transient(exc: BaseException) -> bool:
    """True for failures that another attempt may get past."""
    if isinstance(exc, InstallerError):
        return False
    if isinstance(exc, (TransientHTTPError, IncompleteBodyError, SlowTransferError)):
        return True
    wire = _wire_errors()
    if isinstance(exc, wire.tls):
        # An untrusted certificate will not become trusted by waiting.
        return not _cert_verify_failure(exc)
    if isinstance(exc, wire.transient):
        return True
    # A socket reset surfacing raw from a read.
    return isinstance(exc, (ConnectionResetError, ConnectionAbortedError, TimeoutError))


CAUSE_MAX_CHARS = 300
# urllib3's NameResolutionError text: "Failed to resolve '<host>' (<gaierror>)".
_FAILED_TO_RESOLVE = re.compile(r"Failed to resolve '([^'\s]+)'")


def unresolved_host(exc: BaseException) -> str | None:
    """The host whose name lookup failed, when that is what ``exc`` (or what it wraps: requests
    puts urllib3's MaxRetryError, whose reason is the NameResolutionError, in its args) is."""
    name_resolution = _wire_errors().name_resolution
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, name_resolution):
            found = _FAILED_TO_RESOLVE.search(str(cur))
            return found.group(1) if found else None
        linked = [cur.__cause__, cur.__context__, getattr(cur, "reason", None), *cur.args]
        todo.extend(e for e in linked if isinstance(e, BaseException))
    return None


def cut_at_word(text: str, limit: int = CAUSE_MAX_CHARS) -> str:
    """``text`` up to ``limit`` characters, cut between words (never mid-word) with " ..."."""
    if len(text) <= limit:
        return text
    head = text[:limit - 4]
    head = head.rsplit(" ", 1)[0] if " " in head else head
    return head.rstrip(" ,;:(") + " ..."


def describe_cause(exc: BaseException, redact: Callable[[str], str] | None = None) -> str:
    """One line naming the failure (``ReadTimeout: ...``), secrets removed by ``redact``.
    A failed name lookup is said as such, naming the host (urllib3's own text for it runs
    past the line's bound: pool, URL, connection object, then the resolver's words)."""
    host = unresolved_host(exc)
    if host is not None:
        text = f"cannot resolve host {host!r} (DNS: no such name, or no DNS reachable)"
        return redact(text) if redact is not None else text
    text = str(exc) or exc.__class__.__name__
    text = cut_at_word(" ".join(text.split()))
    if redact is not None:
        text = redact(text)
    if isinstance(exc, TransientHTTPError):
        return text
    return f"{exc.__class__.__name__}: {text}"


# --------------------------------------------------------------------------- retryer


def sleep(seconds: float) -> None:
    """The sleep between attempts (tests replace this module attribute)."""
    time.sleep(seconds)


RETRY_AFTER_SPREAD = 0.1


class _Wait:
    """Exponential backoff with jitter; ``Retry-After`` wins when the server sent one."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        p = self.policy
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            # Never earlier than asked, but spread over another 10 %: thousands of nodes told
            # "come back in 10 s" must not all return in the same second.
            asked = max(retry_after, 0.0)
            jittered = asked + random.uniform(0, asked * RETRY_AFTER_SPREAD)  # noqa: S311
            return float(min(jittered, p.wait_max))
        n = max(retry_state.attempt_number, 1)
        base = min(p.wait_max, p.wait_initial * (2 ** (n - 1)))
        # "Equal jitter": at least half the backoff, spread over the other half.
        return float(base / 2 + random.uniform(0, base / 2))  # noqa: S311 - not crypto


def _upcoming_sleep(retry_state: tenacity.RetryCallState) -> float:
    """The wait before the next attempt (tenacity >= 8.3 computes it before ``stop``)."""
    value = getattr(retry_state, "upcoming_sleep", None)
    if value is None and retry_state.next_action is not None:  # older tenacity
        value = retry_state.next_action.sleep
    return float(value or 0.0)


class _Stop:
    """Stop when the attempts are used up, or when the next attempt would start too late
    (after the policy's total timeout, or the download's deadline)."""

    def __init__(self, policy: RetryPolicy, deadline_at: float | None = None) -> None:
        self.policy = policy
        self.deadline_at = deadline_at

    def limit_reached(self, retry_state: tenacity.RetryCallState) -> str | None:
        p = self.policy
        if retry_state.attempt_number >= p.attempts:
            return "attempts"
        elapsed = retry_state.seconds_since_start or 0.0
        upcoming = _upcoming_sleep(retry_state)
        if elapsed + upcoming >= p.total_timeout:
            return "total_timeout"
        if self.deadline_at is not None and time.monotonic() + upcoming >= self.deadline_at:
            return "deadline"
        return None

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.limit_reached(retry_state) is not None


def network_retryer(
    policy: RetryPolicy,
    *,
    url: str | None = None,
    redact: Callable[[str], str] | None = None,
    sleep_fn: Callable[[float], Any] | None = None,
    deadline_at: float | None = None,
) -> tenacity.Retrying:
    """A ``tenacity.Retrying`` for ``policy`` that retries transient failures only.

    ``url`` (already redacted, or give ``redact``) is named in the log events and
    in the final error. ``sleep_fn`` replaces the sleep between attempts (e.g. an
    ``Event.wait`` so a cancelled job stops waiting). No attempt starts (and no
    wait is slept) past ``deadline_at`` (``time.monotonic()`` clock).
    """
    # Deferred to the first retried operation: a run that fetches nothing (a cache hit,
    # every boot) never loads tenacity.
    import tenacity

    shown_url = redact(url) if (url is not None and redact is not None) else url
    stop = _Stop(policy, deadline_at)

    def before_sleep(retry_state: tenacity.RetryCallState) -> None:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        log.warning(
            "download_retry",
            url=shown_url,
            attempt=retry_state.attempt_number,
            attempts=policy.attempts,
            wait_s=round(_upcoming_sleep(retry_state), 3),
            cause=describe_cause(exc, redact) if exc is not None else None,
        )

    def do_sleep(seconds: float) -> None:
        if sleep_fn is not None:
            sleep_fn(seconds)
        else:
            sleep(seconds)  # looked up at call time, so tests can replace it

    return tenacity.Retrying(
        stop=stop,
        wait=_Wait(policy),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=before_sleep,
        retry_error_callback=functools.partial(_give_up, policy=policy, stop=stop,
                                               shown_url=shown_url, redact=redact),
        sleep=do_sleep,
        reraise=True,
    )


def _give_up(retry_state: tenacity.RetryCallState, *, policy: RetryPolicy, stop: _Stop,
             shown_url: str | None, redact: Callable[[str], str] | None) -> NoReturn:
    """The one error of a download that ran out of attempts, deadline or total time."""
    outcome = retry_state.outcome
    exc = outcome.exception() if outcome is not None else None
    which = stop.limit_reached(retry_state) or "attempts"
    elapsed = retry_state.seconds_since_start or 0.0
    cause = describe_cause(exc, redact) if exc is not None else "unknown"
    if which == "attempts":
        limit = f"attempt limit reached ({policy.attempts} attempts, {ENV_RETRIES})"
    elif which == "deadline":
        limit = (f"download deadline reached (--download-deadline) after "
                 f"{retry_state.attempt_number} attempts")
    else:
        limit = (
            f"total timeout reached ({policy.total_timeout:g}s, {ENV_TIMEOUT}) "
            f"after {retry_state.attempt_number} attempts"
        )
    target = f" {shown_url}" if shown_url else ""
    hint = None
    if isinstance(exc, TransientHTTPError):
        hint = "the server keeps failing; try again later or use a mirror"
    elif exc is not None and unresolved_host(exc) is not None:
        hint = (f"check the URL (is {unresolved_host(exc)!r} the right host name?) and DNS from "
                "the node")
    elif exc is not None:
        hint = "check network access, proxy settings (HTTPS_PROXY) and DNS from the node"
    log.debug(  # the DownloadError below is the one error event
        "download_gave_up",
        url=shown_url,
        limit=which,
        attempts=retry_state.attempt_number,
        elapsed_s=round(elapsed, 3),
        cause=cause,
    )
    raise DownloadError(
        f"giving up on{target}: {limit}; last error: {cause}",
        hint=hint,
        url=shown_url,
        limit=which,
        attempts=retry_state.attempt_number,
    ) from exc

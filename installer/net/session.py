"""The HTTP session, and the one reading of what a server answered.

Every request the installer makes (downloads, small fetches, existence probes) goes
through a session from :func:`make_session` (``file://`` through its
:class:`LocalFSAdapter`) and has its answer read by
:func:`classify`, so a redirect to plain http, a 429/5xx (retried) or a 4xx (not)
mean the same wherever they happen; :func:`refuse_encoding` guards every body read,
and :func:`request_errors` turns a non-transient ``requests`` failure into the one
message shape, with the URL's secrets scrubbed.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import BinaryIO

import requests
import requests.adapters
import requests.auth
import requests.structures
import urllib3.response

from installer import __version__
from installer.base.errors import DownloadError
from installer.base.fsutil import file_kind
from installer.net.policy import UrlPolicy, local_path, redact_url
from installer.net.retry import (
    NETWORK_DEFAULTS,
    RetryPolicy,
    TransferLimits,
    TransientHTTPError,
    describe_cause,
    parse_retry_after,
)


class _URLAuthOnly(requests.auth.AuthBase):
    """Credentials from the request's own URL (``user:pass@``), as ``requests`` takes them
    when no auth is given (``PreparedRequest.prepare_auth(None)``), and nothing else."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.prepare_auth(None)
        return r


class LocalAnswer(requests.Response):
    """What :class:`LocalFSAdapter` answered (so :func:`classify` can word a missing local
    artifact as one)."""


class LocalFSAdapter(requests.adapters.BaseAdapter):
    """``file://`` answered the way a server answers, so downloads, fetches and probes read
    local files through the same session, retries, limits and digest as remote ones, and
    none of them tells local from remote itself. The idea is pip's ``LocalFSAdapter``
    (pip's src/pip/_internal/network/session.py: a 404 for a path it cannot stat, the
    open file as the body with its Content-Length, mounted on ``PipSession`` for
    ``file://``); unlike pip's, this one refuses anything but a regular file.

    A missing path is a 404 (:func:`classify` words it as a missing local file); HEAD is
    200 only for a regular file (what ``Path.is_file`` says). A GET opens the file
    non-blocking and refuses anything but a regular file, so a FIFO planted where an
    artifact should be cannot hang the run. Range headers are ignored: the whole file
    comes back as a 200, which the transfer reads as a restart from 0.
    """

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: float | tuple[float, float] | tuple[float, None] | None = None,
             verify: bool | str = True,
             cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
             proxies: Mapping[str, str] | None = None) -> requests.Response:
        url = request.url or ""
        path = local_path(url)
        if request.method == "HEAD":
            try:
                regular = stat.S_ISREG(os.stat(path).st_mode)
            except OSError:
                regular = False
            return self._answer(request, 200 if regular else 404, io.BytesIO(b""), 0)
        try:
            fh = open(path, "rb", opener=_open_nonblocking)  # noqa: SIM115 - the response owns it
        except (FileNotFoundError, NotADirectoryError):
            return self._answer(request, 404, io.BytesIO(b""), 0)
        except OSError as exc:
            raise DownloadError(f"cannot read {path}: {exc.strerror or exc}", path=str(path),
                                url=redact_url(url)) from exc
        try:
            st = os.fstat(fh.fileno())
        except OSError as exc:
            fh.close()
            raise DownloadError(f"cannot read {path}: {exc.strerror or exc}", path=str(path),
                                url=redact_url(url)) from exc
        if not stat.S_ISREG(st.st_mode):
            fh.close()
            raise DownloadError(f"{path} is {file_kind(st.st_mode)}, not a regular file ({redact_url(url)})",
                                path=str(path), url=redact_url(url))
        return self._answer(request, 200, fh, st.st_size)

    def _answer(self, request: requests.PreparedRequest, status: int, body: BinaryIO,
                size: int) -> requests.Response:
        headers = {"Content-Length": str(size)}
        resp = LocalAnswer()
        resp.status_code = status
        resp.reason = "OK" if status == 200 else "Not Found"
        resp.url = request.url or ""
        resp.request = request
        resp.headers = requests.structures.CaseInsensitiveDict(headers)
        resp.raw = urllib3.response.HTTPResponse(body=body, headers=headers, status=status,
                                                 preload_content=False, decode_content=False)
        return resp

    def close(self) -> None:
        pass


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


def _missing_local(resp: requests.Response, shown: str) -> DownloadError:
    """A 404 from :class:`LocalFSAdapter`: the pre-staged artifact is not there."""
    path = local_path(resp.url)
    return DownloadError(
        f"{path} does not exist ({shown})",
        hint="pre-stage the artifact at that path, or use an https:// URL",
        path=str(path),
        url=shown,
        status=404,  # file://'s "not found": callers treat a missing artifact one way
    )


class ArtifactSession(requests.Session):
    """The installer's one HTTP session type: it carries the run's transfer policies as
    typed attributes (as pip's ``PipSession`` carries its trust settings), and serves
    ``file://`` through :class:`LocalFSAdapter`.

    ``transfer_limits``: the deadline and minimum rate of every download through it;
    ``retry_policy``: how each operation is retried (from Settings through the Context);
    ``url_policy``: which URLs every request through it may name or be redirected to.

    ``trust_env`` without ``.netrc``: in the pod ``HOME=/root`` is the host's root, and
    its ``.netrc`` holds the host's credentials, never meant for NVIDIA's or Google's servers.

    ``requests`` 2.x reads netrc in exactly two places, both under ``trust_env``:
    ``Session.prepare_request`` (``if self.trust_env and not auth and not self.auth:
    auth = get_netrc_auth(url)``, sessions.py L537-538 in 2.34) and
    ``Session.rebuild_auth`` on every redirect (``get_netrc_auth(url) if self.trust_env``,
    L330). A session-level ``auth`` closes the first, the override below the second.
    ``trust_env`` itself stays on, so ``merge_environment_settings`` (L845-860: proxies
    from the environment, ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``) and
    ``rebuild_proxies`` (``NO_PROXY`` re-checked per redirect) work as in ``requests``.
    No adapter-level retries: :mod:`installer.net.retry` decides.
    """

    transfer_limits: TransferLimits
    retry_policy: RetryPolicy
    url_policy: UrlPolicy

    def __init__(self, *, limits: TransferLimits | None = None, policy: RetryPolicy | None = None,
                 url_policy: UrlPolicy | None = None) -> None:
        super().__init__()
        self.trust_env = True
        self.auth = _URLAuthOnly()
        self.transfer_limits = limits or TransferLimits()
        self.retry_policy = policy or NETWORK_DEFAULTS
        self.url_policy = url_policy or UrlPolicy()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16, max_retries=0)
        self.mount("https://", adapter)
        self.mount("http://", adapter)
        self.mount("file://", LocalFSAdapter())

    def rebuild_auth(self, prepared_request: requests.PreparedRequest,
                     response: requests.Response) -> None:
        # requests' own rebuild_auth minus the netrc lookup: drop credentials when a
        # redirect leaves the host they were meant for.
        original = response.request
        if ("Authorization" in prepared_request.headers and original is not None
                and original.url is not None and prepared_request.url is not None
                # types-requests leaves should_strip_auth unannotated (it takes two URLs)
                and self.should_strip_auth(  # type: ignore[no-untyped-call]
                    original.url, prepared_request.url)):
            del prepared_request.headers["Authorization"]


def make_session(*, user_agent: str | None = None, limits: TransferLimits | None = None,
                 policy: RetryPolicy | None = None,
                 url_policy: UrlPolicy | None = None) -> ArtifactSession:
    """An :class:`ArtifactSession` for artifact downloads.

    Honours ``HTTPS_PROXY``/``NO_PROXY`` and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
    as ``requests`` does (``trust_env``), but never ``.netrc``. ``requests`` ignores ``SSL_CERT_FILE``
    (it uses certifi), so when neither of its own variables is set, a
    ``SSL_CERT_FILE`` (or ``SSL_CERT_DIR``) is used as the trust store.
    ``limits`` default to :class:`~installer.net.retry.TransferLimits`, ``policy`` to
    ``NETWORK_DEFAULTS``, ``url_policy`` to https (and file) only.
    """
    session = ArtifactSession(limits=limits, policy=policy, url_policy=url_policy)
    session.headers["User-Agent"] = (
        user_agent or f"nvidia-driver-installer/{__version__} {requests.utils.default_user_agent()}"
    )
    if not (os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")):
        for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            value = os.environ.get(var)
            if value and os.path.exists(value):
                session.verify = value
                break
    return session


def or_default(session: ArtifactSession | None) -> ArtifactSession:
    """``session``, or for None a session with the default policies (enough for
    ``file://`` and for callers that set no policy of their own)."""
    return session if session is not None else make_session()


def classify(resp: requests.Response, shown: str, url_policy: UrlPolicy, *,
             expected: Collection[int] = (200,), missing: Collection[int] = ()) -> bool:
    """True for an ``expected`` status, False for a ``missing`` one (the object is absent).

    Raises :class:`DownloadError` for a redirect that ended on plain http (unless
    allowed) and for any other status, :class:`TransientHTTPError` (retried) for 429
    and 5xx. ``shown`` is the redacted URL.
    """
    url_policy.check_redirect(resp.url or "", shown)
    status = resp.status_code
    if status in expected:
        return True
    if status in missing:
        return False
    if status == 404 and isinstance(resp, LocalAnswer):
        raise _missing_local(resp, shown)
    if status == 429 or 500 <= status <= 599:
        raise TransientHTTPError(status, resp.reason or "",
                                 retry_after=parse_retry_after(resp.headers.get("Retry-After")))
    reason = resp.reason or ""
    hint = None
    if status == 404:
        hint = "check the driver version and the URL (is that version published for this host?)"
    elif status in (401, 403):
        hint = "the server refused access: check the URL, its credentials or signature"
    elif 300 <= status < 400:
        hint = "the server answered with a redirect that was not followed"
    raise DownloadError(
        f"HTTP {status} {reason} for {shown}".replace("  ", " "),
        hint=hint,
        url=shown,
        status=status,
    )


def refuse_encoding(resp: requests.Response, shown: str) -> None:
    """We ask for ``identity``; a compressed body would expand past every size check."""
    enc = resp.headers.get("Content-Encoding", "").strip().lower()
    if enc not in ("", "identity"):
        raise DownloadError(
            f"{shown}: the server sent a {enc!r}-encoded body though the installer asked for "
            "identity (Accept-Encoding: identity); refusing it",
            hint="the server or a proxy in between recompresses artifacts: fetch them from one "
            "that serves the file as it is",
            url=shown, content_encoding=enc)


@contextlib.contextmanager
def request_errors(shown: str, scrub: Callable[[str], str], *,
                   doing: str = "download of") -> Iterator[None]:
    """A ``requests`` failure the retries let through (not transient: an untrusted
    certificate, too many redirects), raised as one :class:`DownloadError`."""
    try:
        yield
    except requests.RequestException as exc:
        raise _request_error(exc, shown, scrub, doing=doing) from exc


def _request_error(exc: BaseException, shown: str, scrub: Callable[[str], str], *,
                   doing: str) -> DownloadError:
    """A ``requests`` failure that is not transient, as one line without secrets."""
    cause = describe_cause(exc, scrub)
    hint = None
    if isinstance(exc, requests.exceptions.SSLError):
        hint = (
            "the server's certificate is not trusted: set REQUESTS_CA_BUNDLE "
            "(or SSL_CERT_FILE) to the CA bundle that signs it"
        )
    elif isinstance(exc, requests.exceptions.TooManyRedirects):
        hint = "the URL redirects in a loop"
    return DownloadError(f"{doing} {shown} failed: {cause}", hint=hint, url=shown)

"""The HTTP session, and the one reading of what a server answered.

Every request the installer makes (downloads, small fetches, existence probes) goes
through a session from :func:`make_session` and has its answer read by
:func:`classify`, so a redirect to plain http, a 429/5xx (retried) or a 4xx (not)
mean the same wherever they happen; :func:`refuse_encoding` guards every body read,
and :func:`request_error` turns a non-transient ``requests`` failure into the one
message shape, with the URL's secrets scrubbed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

import requests
import requests.adapters
import requests.auth

from installer import __version__
from installer.errors import DownloadError
from installer.net.policy import UrlPolicy
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


class ArtifactSession(requests.Session):
    """``trust_env`` without ``.netrc``: in the pod ``HOME=/root`` is the host's root, and
    its ``.netrc`` holds the host's credentials, never meant for NVIDIA's or Google's servers.

    ``requests`` 2.x reads netrc in exactly two places, both under ``trust_env``:
    ``Session.prepare_request`` (``if self.trust_env and not auth and not self.auth:
    auth = get_netrc_auth(url)``, sessions.py L537-538 in 2.34) and
    ``Session.rebuild_auth`` on every redirect (``get_netrc_auth(url) if self.trust_env``,
    L330). A session-level ``auth`` closes the first, the override below the second.
    ``trust_env`` itself stays on, so ``merge_environment_settings`` (L845-860: proxies
    from the environment, ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``) and
    ``rebuild_proxies`` (``NO_PROXY`` re-checked per redirect) work as in ``requests``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = True
        self.auth = _URLAuthOnly()

    def rebuild_auth(self, prepared_request: requests.PreparedRequest,
                     response: requests.Response) -> None:
        # requests' own rebuild_auth minus the netrc lookup: drop credentials when a
        # redirect leaves the host they were meant for.
        original = response.request
        if ("Authorization" in prepared_request.headers and original is not None
                and self.should_strip_auth(original.url, prepared_request.url)):
            del prepared_request.headers["Authorization"]


def make_session(*, user_agent: str | None = None, limits: TransferLimits | None = None,
                 policy: RetryPolicy | None = None,
                 url_policy: UrlPolicy | None = None) -> requests.Session:
    """A ``requests.Session`` for artifact downloads (an :class:`ArtifactSession`).

    Honours ``HTTPS_PROXY``/``NO_PROXY`` and ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
    as ``requests`` does (``trust_env``), but never ``.netrc``. ``requests`` ignores ``SSL_CERT_FILE``
    (it uses certifi), so when neither of its own variables is set, a
    ``SSL_CERT_FILE`` (or ``SSL_CERT_DIR``) is used as the trust store.
    No adapter-level retries: :mod:`installer.net.retry` decides. ``limits`` (the
    deadline and minimum rate of every download through this session)
    default to :class:`~installer.net.retry.TransferLimits`; ``policy`` (how each operation
    is retried, from Settings through the Context) to ``NETWORK_DEFAULTS``; ``url_policy``
    (which URLs every request through it may name or be redirected to) to https only.
    """
    session = ArtifactSession()
    session.transfer_limits = limits or TransferLimits()  # type: ignore[attr-defined]
    session.retry_policy = policy or NETWORK_DEFAULTS  # type: ignore[attr-defined]
    session.url_policy = url_policy or UrlPolicy()  # type: ignore[attr-defined]
    session.headers["User-Agent"] = (
        user_agent or f"nvidia-driver-installer/{__version__} {requests.utils.default_user_agent()}"
    )
    if not (os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")):
        for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            value = os.environ.get(var)
            if value and os.path.exists(value):
                session.verify = value
                break
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16, max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


def limits_of(session: requests.Session | None) -> TransferLimits:
    """The session's transfer limits (defaults for a session not made here)."""
    return getattr(session, "transfer_limits", None) or TransferLimits()


def policy_of(session: requests.Session | None) -> RetryPolicy:
    """The session's retry policy (the defaults for none, or one not made here)."""
    return getattr(session, "retry_policy", None) or NETWORK_DEFAULTS


def url_policy_of(session: requests.Session | None) -> UrlPolicy:
    """The session's URL policy (https only for none, or one not made here)."""
    return getattr(session, "url_policy", None) or UrlPolicy()


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


def request_error(exc: BaseException, shown: str, scrub: Callable[[str], str], *,
                  doing: str = "download of") -> DownloadError:
    """A ``requests`` failure that is not transient (e.g. an untrusted certificate, too
    many redirects), as one line without secrets."""
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

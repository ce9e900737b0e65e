"""URLs: which ones we fetch, how they are shown, and the file names they give.

- :func:`check_url_scheme`: URLs the operator configured (flags, env vars):
  ``https://`` and ``file://``, ``http://`` only when allowed.
- :func:`from_metadata`: URLs read from remote metadata (a COS build's
  ``toolchain_url``): whoever serves the metadata must not be able to send us
  to a local file, a FIFO, or another host. Only a relative location or an
  https URL on the same origin as the artifacts is accepted.
- :func:`redact_url`: a URL without its secrets, for logs, messages and files;
  :func:`scrub` removes them from everything the installer emits (below).
- :func:`file_name`: the local name of what a URL names, never a path out of the
  directory it is saved in.

No ``requests`` import here: a cache hit checks URLs but downloads nothing.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from installer.base.dataclass import dataclass
from installer.base.errors import DownloadError, IntegrityError, UsageError

GCS_HTTPS = "https://storage.googleapis.com/"


def redact_url(url: str) -> str:
    """``url`` without secrets: userinfo becomes ``***@``, query values ``***``, no fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = "***@" + host + (f":{port}" if port is not None else "")
    query = parts.query
    if query:
        query = "&".join(
            (piece.split("=", 1)[0] + "=***") if "=" in piece else piece for piece in query.split("&")
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def local_path(url: str) -> Path:
    """The path of a ``file://`` URL (``file:///abs`` or ``file://localhost/abs``)."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(
            f"file URL {redact_url(url)} names host {parts.netloc!r}",
            hint="use file:///absolute/path (three slashes)",
            url=redact_url(url),
        )
    # What urllib.request.url2pathname does on POSIX (the percent-decoded path), without
    # importing urllib.request (http.client, email: ~8 ms of every start-up).
    return Path(unquote(parts.path))


def local_file(url: str) -> Path | None:
    """The path a ``file://`` URL names (see :func:`local_path`); None for any other URL.
    (Downloads, fetches and probes do not ask: the session's LocalFSAdapter serves it.)"""
    return local_path(url) if urlsplit(url).scheme.lower() == "file" else None


@dataclass(frozen=True)
class UrlPolicy:
    """The URLs a run may fetch: https and file always, plain http only with
    --allow-insecure-http. Built once (detect.context) and carried by the run's HTTP
    session (``ArtifactSession.url_policy``), as pip's PipSession carries its trust settings."""

    allow_insecure_http: bool = False

    def check(self, url: str) -> None:
        """UsageError for a URL this run may not fetch."""
        check_url_scheme(url, allow_insecure_http=self.allow_insecure_http)

    def check_redirect(self, final: str, shown: str) -> None:
        """DownloadError for a request that was redirected to plain http, unless allowed."""
        if final.lower().startswith("http://") and not self.allow_insecure_http:
            raise DownloadError(
                f"{shown} redirected to plain http URL {redact_url(final)}",
                hint="use a URL that stays on https, or pass --allow-insecure-http",
                url=shown,
            )


def check_url_scheme(url: str, *, allow_insecure_http: bool) -> None:
    """Accept ``https://`` and ``file://``; ``http://`` only when allowed; refuse the rest."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise UsageError(f"invalid URL {shown}: {exc}", url=shown) from exc
    scheme = parts.scheme.lower()
    if scheme == "https":
        if not host:
            raise UsageError(f"URL {shown} has no host", url=shown)
        return
    if scheme == "file":
        local_path(url)
        return
    if scheme == "http":
        if not allow_insecure_http:
            raise UsageError(
                f"refusing plain http URL {shown}: use https:// or pass "
                "--allow-insecure-http (ALLOW_INSECURE_HTTP=1)",
                hint="artifacts fetched over http can be altered in transit; "
                "prefer https, or pin --driver-sha256",
                url=shown,
            )
        if not host:
            raise UsageError(f"URL {shown} has no host", url=shown)
        return
    hint = "use an https:// or file:// URL"
    if scheme == "gs":
        hint = "use https://storage.googleapis.com/<bucket>/<object> instead of gs://"
    what = f"scheme {scheme}://" if scheme else "no scheme"
    raise UsageError(f"unsupported URL {shown} ({what})", hint=hint, url=shown)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"https": 443, "http": 80}.get(scheme)
    return scheme, (parts.hostname or "").lower() or None, port


def artifacts_root(template: str) -> str:
    """The part of an artifacts URL template the operator fixed: up to the directory of the
    first ``{placeholder}`` (the whole URL when it has none)."""
    cut = template.find("{")
    return template.rstrip("/") if cut < 0 else template[:cut].rsplit("/", 1)[0]


def from_metadata(location: str, base: str, *, root: str | None = None, what: str,
                  source: str) -> str:
    """The URL a remote metadata file names, if we may fetch it (IntegrityError, exit 6, if not).

    ``location`` came from ``source`` (a file under the artifacts ``base``).
    A relative path is taken under ``base`` and may not leave ``root`` (the
    artifacts tree the operator configured, see :func:`artifacts_root`; a
    mirror may keep one toolchain beside its build dirs). ``gs://b/o`` means
    ``https://storage.googleapis.com/b/o``. An absolute URL must be https on
    ``base``'s own origin (scheme, host and port). Never ``file://`` or another
    scheme: a bucket must not make a privileged installer read host files.
    """
    root = (root or base).rstrip("/")
    try:
        parts = urlsplit(location)
        scheme = parts.scheme.lower()
        if scheme == "gs":
            location = GCS_HTTPS + location[len("gs://"):]
            parts, scheme = urlsplit(location), "https"
        if not scheme and not parts.netloc:
            if not parts.path or parts.path.startswith("/"):
                raise ValueError(f"{location!r} is not a path relative to the build's artifacts")
            joined = urlsplit(f"{base.rstrip('/')}/{location}")
            path = posixpath.normpath(joined.path)
            if not (path + "/").startswith(urlsplit(root).path.rstrip("/") + "/"):
                raise ValueError(f"{location!r} leads out of the artifacts at {redact_url(root)}")
            return urlunsplit(joined._replace(path=path))
        if scheme != "https" or _origin(location) != _origin(base):
            raise ValueError(f"{redact_url(location)} is not an https URL on the artifacts' own "
                             f"origin ({redact_url(base)})")
    except ValueError as exc:
        raise IntegrityError(
            f"refusing the {what} location in {redact_url(source)}: {exc}",
            hint="metadata may only name a path inside the artifacts or an https URL on the same "
            "host; mirror the file there and make the location relative",
            url=redact_url(source),
        ) from None
    return location


def file_name(url: str, fallback: str) -> str:
    """The last path segment of ``url`` (query dropped, percent-escapes decoded), or
    ``fallback`` when that is empty, ``.``, ``..`` or holds a NUL: a URL must not choose
    where outside its download directory a file lands (``%2F`` decodes to a separator
    before the split, so it cannot either)."""
    name = unquote(urlsplit(url).path).rstrip("/").rsplit("/", 1)[-1]
    return name if name and name not in (".", "..") and "\0" not in name else fallback


# --------------------------------------------------------------------------- redaction
# Secrets in URLs never reach a log event, a message or a file. Everything the installer
# emits passes through scrub(): every log event (the structlog processor, last before
# rendering), the final error message, status.json, --dry-run output and a bug's traceback.
# It rewrites every URL in every string with redact_url() and removes the secret parts of
# the URLs we were given or fetched (register_url) wherever else they appear, e.g. an
# exception text quoting a query string without its URL.

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s\"'<>]+")
_MIN_SECRET = 4  # shorter values ("1", "abc") would blank out ordinary words
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def url_secrets(url: str) -> set[str]:
    """The parts of ``url`` that may be credentials: userinfo and query values."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
        for piece in parts.query.split("&") if parts.query else ():
            if "=" in piece:
                found.add(piece.split("=", 1)[1])
        found.update(v for _, v in parse_qsl(parts.query))
        for value in (parts.username, parts.password):
            if value:
                found.add(value)
    except ValueError:
        pass
    found |= {unquote(s) for s in found}
    return {s for s in found if len(s) >= _MIN_SECRET}


def register_url(url: str | None) -> None:
    """Remember ``url``'s secrets so they are removed from any later output."""
    global _pattern
    new = url_secrets(url) - _secrets if url else set()
    if new:
        _secrets.update(new)
        _pattern = re.compile("|".join(re.escape(s) for s in sorted(_secrets, key=len,
                                                                      reverse=True)))


def scrubber(url: str) -> Callable[[str], str]:
    """A function removing ``url``'s secrets from any text (e.g. an exception message)."""
    register_url(url)
    return scrub_text


def scrub_text(text: str) -> str:
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    if _pattern is not None:
        text = _pattern.sub("***", text)
    return text


def scrub(value: Any) -> Any:
    """``value`` (a string, or dicts/lists/tuples of them) with secrets removed."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub(v) for v in value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub_text(str(value))  # paths, exceptions: rendered as text anyway


def processor(_logger: Any, _method: str,
              event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: every event, every field."""
    scrubbed: dict[str, Any] = scrub(event_dict)
    return scrubbed

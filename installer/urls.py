"""URLs: which ones we fetch, and how they are shown.

- :func:`check_url_scheme`: URLs the operator configured (flags, env vars):
  ``https://`` and ``file://``, ``http://`` only when allowed.
- :func:`from_metadata`: URLs read from remote metadata (a COS build's
  ``toolchain_url``): whoever serves the metadata must not be able to send us
  to a local file, a FIFO, or another host. Only a relative location or an
  https URL on the same origin as the artifacts is accepted.
- :func:`redact_url`: a URL without its secrets, for logs, messages and files.

No ``requests`` import here: a cache hit checks URLs but downloads nothing.
"""

from __future__ import annotations

import posixpath
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from installer.errors import IntegrityError, UsageError

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
    return Path(urllib.request.url2pathname(parts.path))


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

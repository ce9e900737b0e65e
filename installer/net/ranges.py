"""What a server's answer means for a download resumed with ``Range`` (RFC 9110 §14):
the headers asking for the rest, and the extent of the body an answer carries, or that
the download restarts from 0 (a 416, a range ignored, a mismatched ``Content-Range``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

import structlog

if TYPE_CHECKING:
    import requests

log = structlog.get_logger(__name__)

_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class Resumable(Protocol):
    """What a download knows about itself between attempts (transfer's sinks)."""

    shown: str
    total: int | None
    validator: str | None
    resumed_bytes: int

    def reset(self) -> None: ...


def range_headers(offset: int, validator: str | None) -> dict[str, str]:
    """The request for what is still missing: all of it, or from ``offset`` on (only if the
    resource is still the one ``validator`` names)."""
    headers = {"Accept-Encoding": "identity"}
    if offset > 0:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    return headers


def content_length(resp: requests.Response) -> int | None:
    raw = resp.headers.get("Content-Length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


def validator(resp: requests.Response) -> str | None:
    etag = resp.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return resp.headers.get("Last-Modified")


def answer_extent(resp: requests.Response, st: Resumable,
                  asked: int) -> tuple[int | None, int | None] | None:
    """(the whole size, where this body ends) of a 200 or 206 answering a request from
    ``asked``; None when the answer restarts the download from 0 (``st`` is reset and a
    fresh request follows)."""
    shown = st.shown
    if resp.status_code == 416:
        log.warning("download_restart", url=shown, reason="range_not_satisfiable", offset=asked)
        st.reset()
        return None
    if resp.status_code == 200:
        if asked > 0:
            log.warning("download_restart", url=shown, reason="range_ignored", offset=asked)
            st.reset()
        total = content_length(resp)
        st.validator = validator(resp)
        return total, total
    m = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
    start = int(m.group(1)) if m else -1
    full = int(m.group(3)) if m and m.group(3) != "*" else None
    if m is None or start != asked or (full is not None and st.total is not None
                                       and full != st.total):
        log.warning("download_restart", url=shown, reason="content_range_mismatch", offset=asked,
                    content_range=resp.headers.get("Content-Range"))
        st.reset()
        return None
    total = full if full is not None else st.total
    if asked > 0:
        st.resumed_bytes += asked
        log.info("download_resumed", url=shown, offset=asked, total=total)
    return total, int(m.group(2)) + 1

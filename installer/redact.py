"""Secrets in URLs never reach a log event, a message or a file.

Everything the installer emits passes through :func:`scrub`: every log event
(the structlog processor :func:`processor`, last before rendering), the final
error message, ``status.json``, ``--dry-run`` output and a bug's traceback.
It rewrites every URL in every string with :func:`installer.urls.redact_url`
(userinfo and query values become ``***``) and removes the secret parts of
the URLs we were given or fetched (:func:`register_url`) wherever else they
appear, e.g. an exception text quoting a query string without its URL.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from installer.urls import redact_url

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


def processor(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: every event, every field."""
    return scrub(event_dict)

"""structlog set-up: JSON lines in the cluster, a readable console on a terminal; every
event is redacted (installer.net.policy) before it is rendered.

JSON keeps every field on every line (tools parse it). The console is for a person:
see :class:`ConsoleRenderer`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from installer.base.errors import clip
from installer.net.policy import processor as redact_processor

FALLBACK_WIDTH = 120  # columns when stderr is no terminal (kubectl logs, a pipe)
MIN_VALUE_CHARS = 16  # a value is never cut shorter than this to fit the width
_PLAIN = re.compile(r"[\w./:@+,~%-]+")
_SAID_BY_MESSAGE = ("error", "hint", "error_class", "exit_code", "step")
_LEVEL_COLORS = {"critical": "31;1", "error": "31;1", "warning": "33", "info": "32",
                 "debug": "2"}


def colors_wanted(stream: Any = None) -> bool:
    """Colors on a terminal only, and never when NO_COLOR is set (https://no-color.org)."""
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and not os.environ.get("NO_COLOR")


def _shown(value: Any) -> str:
    if isinstance(value, str) and _PLAIN.fullmatch(value):
        return value
    return repr(value)


class ConsoleRenderer:
    """One line per event, ``HH:MM:SS level event key=value …``, for a person.

    - Bound context (``os``, ``kernel_release``) shows when it first appears or changes,
      not on every line; None-valued fields are left out.
    - An event carrying a ``message`` (the sentence saying what happened) prints it on
      a line of its own after the fields, and drops the fields it already says (``error``,
      ``hint``): each error is printed once, and a run's last line is its sentence.
    - Unless ``verbose``, long values (step lists, argv) are cut so the line fits the
      terminal (``FALLBACK_WIDTH`` columns when there is none).
    """

    def __init__(self, *, colors: bool, verbose: bool) -> None:
        self.colors = colors
        self.verbose = verbose
        self.context_shown: dict[str, Any] = {}

    def _paint(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colors and code else text

    def __call__(self, _logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        fields = dict(event_dict)
        when = str(fields.pop("timestamp", ""))[11:19]
        level = str(fields.pop("level", method))
        event = str(fields.pop("event", ""))
        message = fields.pop("message", None)
        exception = fields.pop("exception", None)
        # Context last, in a stable order (contextvars come in no particular one).
        for key in sorted(structlog.contextvars.get_contextvars().keys() & fields.keys()):
            value = fields.pop(key)
            if key not in self.context_shown or self.context_shown[key] != value:
                self.context_shown[key] = fields[key] = value
        shown = {k: _shown(v) for k, v in fields.items() if v is not None
                 and not (k in _SAID_BY_MESSAGE and message and str(v) in message)}
        head = " ".join(x for x in (when, self._paint(_LEVEL_COLORS.get(level, ""),
                                                       f"{level:<7}"),
                                     self._paint("1", event)) if x)
        if not self.verbose:
            shown = _fit(shown, _width() - len(f"{when} {level:<7} {event}"))
        line = head + "".join(f" {self._paint('2', k)}={v}" for k, v in shown.items())
        return "\n".join(str(x) for x in (line, message, exception) if x)


def _width() -> int:
    """COLUMNS, else the width of the terminal the logs go to (stderr), else of stdout's,
    else the fallback. A width of 0 is no width (a serial console, `script`, some CI
    terminals report 0 columns): the fallback, not values cut to their minimum."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        width = os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, ValueError, OSError):
        import shutil  # neither stream a terminal: rare, and shutil costs a cache hit ~5 ms

        width = shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns
    return width if width > 0 else FALLBACK_WIDTH


def _fit(shown: dict[str, str], room: int) -> dict[str, str]:
    """Cut the longest values (never below MIN_VALUE_CHARS) until ``key=value``s fit."""
    shown = dict(shown)
    while True:
        over = sum(len(k) + len(v) + 2 for k, v in shown.items()) - room
        longest = max(shown, key=lambda k: len(shown[k]), default=None)
        if over <= 0 or longest is None or len(shown[longest]) <= MIN_VALUE_CHARS + 1:
            return shown
        shown[longest] = clip(shown[longest], max(MIN_VALUE_CHARS, len(shown[longest]) - over - 1))


def configure(log_format: str = "auto", level: str = "info") -> None:
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # Tracebacks become text first, so the redaction below sees them too.
    if use_json:
        processors += [structlog.processors.dict_tracebacks, redact_processor,
                       structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.processors.format_exc_info, redact_processor,
                       ConsoleRenderer(colors=colors_wanted(), verbose=level == "debug")]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        # Resolve sys.stderr per logger, not once: tests swap it, and so may embedders.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )

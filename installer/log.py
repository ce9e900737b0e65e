"""structlog set-up: JSON lines in the cluster, a readable console on a terminal; every
event is redacted (installer.net.policy) before it is rendered."""

from __future__ import annotations

import logging
import sys

import structlog

from installer.net.policy import processor as redact_processor


def configure(log_format: str = "auto", level: str = "info") -> None:
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    processors: list = [
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
                       structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        # Resolve sys.stderr per logger, not once: tests swap it, and so may embedders.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )

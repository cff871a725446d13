"""structlog set-up: JSON lines in production, readable console output in a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

from .redaction import SECRETS


def redact_secrets(
    logger: structlog.types.WrappedLogger, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """The last line of defence: no URL password, password option or known token reaches a log line,
    whichever field (or formatted exception) carries it."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = SECRETS(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
            event[key] = [SECRETS(v) if isinstance(v, str) else v for v in value]
    return event


def configure(level: str = "info", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

"""What every caller that survives a Redis error does with it: log it and count it."""

from __future__ import annotations

from typing import Any

import structlog

from . import metrics
from .redis_errors import redis_error_kind

log = structlog.get_logger("shardq.redis")


def note_redis_error(where: str, exc: BaseException, **context: Any) -> str:
    """Log and count (shardq_redis_errors_total) a Redis error that ``where`` survives; returns its
    kind (redis_errors.redis_error_kind). An outage is a warning; an error reply that is no outage (a
    script error, a wrong type) is logged as an error, since retrying will not fix a bug."""
    kind = redis_error_kind(exc)
    metrics.REDIS_ERRORS.labels(where, kind).inc()
    if kind == "other":
        log.error("redis error", loop=where, kind=kind, error=str(exc), **context)
    else:
        log.warning("redis unavailable", loop=where, kind=kind, error=str(exc), **context)
    return kind

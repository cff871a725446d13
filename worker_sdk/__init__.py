"""shardq worker SDK: ``serve(handlers)`` runs handlers for jobs; ``Client`` enqueues them."""

from __future__ import annotations

from ._client import AsyncClient, Client
from ._context import JobContext
from ._errors import InvalidArgumentError, NotFoundError, Retry, ShardqError, SkipRetry, UnavailableError
from ._schedules import Schedule, ScheduleInfo
from ._worker import Handler, Worker, serve

__all__ = [
    "AsyncClient",
    "Client",
    "Handler",
    "InvalidArgumentError",
    "JobContext",
    "NotFoundError",
    "Retry",
    "ShardqError",
    "Schedule",
    "ScheduleInfo",
    "SkipRetry",
    "UnavailableError",
    "Worker",
    "serve",
]

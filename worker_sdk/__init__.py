"""shardq worker SDK: ``serve(handlers)`` runs handlers for jobs; ``Client`` enqueues them, and
``enqueue_in_transaction`` enqueues inside the application's own PostgreSQL transaction."""

from __future__ import annotations

from ._client import AsyncClient, Client
from ._context import DependencyResult, JobContext
from ._convert import (
    DEAD_REASONS,
    AttemptInfo,
    DependencyInfo,
    DispatcherInfo,
    Identity,
    JobInfo,
    QueueStats,
    RebalancePlan,
    ShardInfo,
    ShardMap,
    ShardMove,
    StatsSnapshot,
    TypeCounters,
    VersionInfo,
    WorkerInfo,
)
from ._errors import (
    InvalidArgumentError,
    NotFoundError,
    RateLimited,
    Retry,
    ShardqError,
    SkipRetry,
    UnavailableError,
)
from ._queues import QueueInfo, QueueSettings, RateLimit
from ._schedules import Schedule, ScheduleInfo
from ._search import BULK_ACTIONS, BulkResult, JobFilter, JobPage
from ._transactional import (
    enqueue_in_transaction,
    enqueue_in_transaction_async,
    enqueue_many_in_transaction,
    enqueue_many_in_transaction_async,
)
from ._waiting import JobCancelledError, JobDeadError, JobNotSucceededError
from ._worker import Handler, Worker, serve
from ._workflows import Batch, Group, OpenBatch, chain, group, job

__all__ = [
    "BULK_ACTIONS",
    "DEAD_REASONS",
    "AsyncClient",
    "AttemptInfo",
    "Batch",
    "BulkResult",
    "Client",
    "DependencyInfo",
    "DependencyResult",
    "DispatcherInfo",
    "Group",
    "Handler",
    "Identity",
    "InvalidArgumentError",
    "JobCancelledError",
    "JobContext",
    "JobDeadError",
    "JobFilter",
    "JobInfo",
    "JobNotSucceededError",
    "JobPage",
    "NotFoundError",
    "OpenBatch",
    "QueueInfo",
    "QueueSettings",
    "QueueStats",
    "RateLimit",
    "RateLimited",
    "RebalancePlan",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "ShardInfo",
    "ShardMap",
    "ShardMove",
    "ShardqError",
    "SkipRetry",
    "StatsSnapshot",
    "TypeCounters",
    "UnavailableError",
    "VersionInfo",
    "Worker",
    "WorkerInfo",
    "chain",
    "enqueue_in_transaction",
    "enqueue_in_transaction_async",
    "enqueue_many_in_transaction",
    "enqueue_many_in_transaction_async",
    "group",
    "job",
    "serve",
]

"""Between Python values and protobuf messages, for both clients."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shardq_common.pb import shardq_pb2 as pb

PRIORITIES = {"high": pb.PRIORITY_HIGH, "default": pb.PRIORITY_DEFAULT, "low": pb.PRIORITY_LOW}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
STATUS_NAMES = {
    pb.JOB_STATUS_DELAYED: "delayed",
    pb.JOB_STATUS_READY: "ready",
    pb.JOB_STATUS_LEASED: "leased",
    pb.JOB_STATUS_SUCCEEDED: "succeeded",
    pb.JOB_STATUS_DEAD: "dead",
    pb.JOB_STATUS_CANCELLED: "cancelled",
    pb.JOB_STATUS_WAITING: "waiting",
    pb.JOB_STATUS_UNSPECIFIED: "unknown",
}
REASONS = {
    "handler_error": pb.DEAD_REASON_HANDLER_ERROR,
    "not_retryable": pb.DEAD_REASON_NOT_RETRYABLE,
    "lease_expired": pb.DEAD_REASON_LEASE_EXPIRED,
    "no_handler": pb.DEAD_REASON_NO_HANDLER,
}
REASON_NAMES = {v: k for k, v in REASONS.items()}
#: Why a job is dead, as ``JobInfo.dead_reason`` and the ``reason`` filters of the dead-letter calls name it.
DEAD_REASONS: tuple[str, ...] = tuple(REASONS)
# json.dumps with any non-default option builds a new encoder per call, a cost that shows on a
# small payload: one encoder is shared.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_BYTES_LIKE = (bytes, bytearray, memoryview)


def encode_payload(payload: Any) -> bytes:
    """bytes as they are; anything else as JSON (never pickle)."""
    if payload is None:
        return b""
    if isinstance(payload, _BYTES_LIKE):
        return bytes(payload)
    return _COMPACT_JSON.encode(payload).encode()


def _seconds(value: float | timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name} must not be negative")
    return seconds


def job_spec(
    job_type: str,
    payload: Any = None,
    *,
    priority: str = "default",
    run_at: datetime | float | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    lease_ttl: float | timedelta | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    depends_on: Iterable[str | tuple[str, str]] | None = None,
    on_failure: str = "fail",
    ref: str | None = None,
    blocks: Iterable[str | tuple[str, str]] | None = None,
) -> pb.JobSpec:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}: use high, default or low")
    spec = pb.JobSpec(
        type=job_type,
        payload=encode_payload(payload),
        priority=PRIORITIES[priority],
        idempotency_key=idempotency_key or "",
        concurrency_key=concurrency_key or "",
    )
    if headers:
        spec.headers.update(headers)
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both")
    if run_at is not None:
        if isinstance(run_at, datetime):
            if run_at.tzinfo is None:
                raise ValueError("run_at must be timezone-aware")
            run_at = run_at.timestamp()
        spec.run_at_ms = math.ceil(float(run_at) * 1000)
    if delay is not None:
        spec.delay_ms = math.ceil(_seconds(delay, "delay") * 1000)
    if max_attempts is not None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        spec.max_attempts = max_attempts
    if lease_ttl is not None:
        spec.lease_ttl_ms = math.ceil(_seconds(lease_ttl, "lease_ttl") * 1000)
    if ref:
        spec.ref = ref
    for dep in depends_on or ():
        job, policy = (dep, on_failure) if isinstance(dep, str) else dep
        if policy not in DEPENDENCY_POLICIES:
            raise ValueError(f"unknown on_failure {policy!r}: use fail or ignore")
        spec.depends_on.add(job=job, on_failure=DEPENDENCY_POLICIES[policy])
    for blocked in blocks or ():
        job, policy = (blocked, on_failure) if isinstance(blocked, str) else blocked
        if policy not in DEPENDENCY_POLICIES:
            raise ValueError(f"unknown on_failure {policy!r}: use fail or ignore")
        spec.blocks.add(job=job, on_failure=DEPENDENCY_POLICIES[policy])
    return spec


#: What a job does when a dependency is dead-lettered or cancelled (issue 21).
DEPENDENCY_POLICIES = {"fail": pb.DEPENDENCY_POLICY_FAIL, "ignore": pb.DEPENDENCY_POLICY_IGNORE}
POLICY_NAMES = {v: k for k, v in DEPENDENCY_POLICIES.items()} | {pb.DEPENDENCY_POLICY_UNSPECIFIED: "fail"}


@dataclass(frozen=True)
class DependencyInfo:
    """One edge of a job's graph: the other job, its status now, the policy and how it finished."""

    job_id: str
    type: str
    status: str
    on_failure: str
    #: succeeded, dead or cancelled once the dependency finished; "" before.
    resolved_state: str

    @classmethod
    def from_pb(cls, e: pb.DependencyEdge) -> DependencyInfo:
        return cls(
            e.job_id,
            e.type,
            STATUS_NAMES.get(e.status, "unknown") if e.status else "deleted",
            POLICY_NAMES.get(e.on_failure, "fail"),
            e.resolved_state,
        )


OUTCOME_NAMES = {
    pb.ATTEMPT_OUTCOME_UNSPECIFIED: "running",
    pb.ATTEMPT_OUTCOME_SUCCEEDED: "succeeded",
    pb.ATTEMPT_OUTCOME_FAILED: "failed",
    pb.ATTEMPT_OUTCOME_LEASE_EXPIRED: "lease_expired",
    pb.ATTEMPT_OUTCOME_CANCELLED: "cancelled",
    pb.ATTEMPT_OUTCOME_RATE_LIMITED: "rate_limited",
}


@dataclass(frozen=True)
class AttemptInfo:
    """One run of a job: a lease its worker received."""

    #: 1.. in the order of the job's runs (rate-limited runs are numbered too).
    attempt: int
    worker_id: str
    started_at_ms: int
    #: 0 while it runs.
    finished_at_ms: int
    #: running, succeeded, failed, lease_expired, cancelled or rate_limited.
    outcome: str
    error: str
    #: The end of the traceback of a failed run ("" when none).
    traceback: str

    @classmethod
    def from_pb(cls, a: pb.Attempt) -> AttemptInfo:
        return cls(
            a.attempt,
            a.worker_id,
            a.started_at_ms,
            a.finished_at_ms,
            OUTCOME_NAMES.get(a.outcome, "unknown"),
            a.error,
            a.traceback,
        )


def decode_progress(text: str) -> Any:
    """A progress report as the handler gave it (a number or a dict); None when there is none."""
    return json.loads(text) if text else None


@dataclass(frozen=True)
class JobInfo:
    id: str
    type: str
    status: str
    priority: str
    payload: bytes
    attempts: int
    failures: int
    expirations: int
    max_attempts: int
    run_at_ms: int
    enqueued_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    lease_until_ms: int
    last_error: str
    dead_reason: str
    idempotency_key: str
    result: bytes
    shard: int
    concurrency_key: str = ""
    #: Retries its handler asked for by raising RateLimited (not counted in attempts).
    rate_limited: int = 0
    #: The job's headers as enqueued (the trace context, when the client injected one).
    headers: dict[str, str] = field(default_factory=dict)
    #: The schedule that materialized it ("" for a plain enqueue).
    schedule: str = ""
    #: From a search: payload or result cut to its max_payload_bytes, last_error to its end
    #: (get_job returns them whole).
    truncated: bool = False
    #: Its runs, oldest first (the latest 100): worker, times, outcome, error and traceback of each.
    attempt_history: tuple[AttemptInfo, ...] = ()
    #: The handler's latest ``ctx.progress(...)`` report (a number or a dict); None: none yet.
    progress: Any = None
    #: The worker of its latest lease (its latest run); "" before its first.
    worker_id: str = ""
    #: Issue 21 (get_job): the jobs it waits for, the jobs waiting for it, and how many of its
    #: dependencies have not finished yet.
    dependencies: tuple[DependencyInfo, ...] = ()
    dependents: tuple[DependencyInfo, ...] = ()
    dependencies_remaining: int = 0

    @classmethod
    def from_pb(cls, j: pb.Job) -> JobInfo:
        return cls(
            id=j.id,
            type=j.type,
            status=STATUS_NAMES.get(j.status, "unknown"),
            priority=PRIORITY_NAMES.get(j.priority, "default"),
            payload=j.payload,
            attempts=j.attempts,
            failures=j.failures,
            expirations=j.expirations,
            max_attempts=j.max_attempts,
            run_at_ms=j.run_at_ms,
            enqueued_at_ms=j.enqueued_at_ms,
            started_at_ms=j.started_at_ms,
            finished_at_ms=j.finished_at_ms,
            lease_until_ms=j.lease_until_ms,
            last_error=j.last_error,
            dead_reason=REASON_NAMES.get(j.dead_reason, ""),
            idempotency_key=j.idempotency_key,
            result=j.result,
            shard=j.shard,
            concurrency_key=j.concurrency_key,
            rate_limited=j.rate_limited,
            headers=dict(j.headers),
            schedule=j.schedule,
            truncated=j.truncated,
            attempt_history=tuple(AttemptInfo.from_pb(a) for a in j.attempt_history),
            progress=decode_progress(j.progress),
            worker_id=j.worker_id,
            dependencies=tuple(DependencyInfo.from_pb(e) for e in j.dependencies),
            dependents=tuple(DependencyInfo.from_pb(e) for e in j.dependents),
            dependencies_remaining=j.dependencies_remaining,
        )


@dataclass(frozen=True)
class QueueStats:
    type: str
    priority: str
    delayed: int
    ready: int
    leased: int
    dead: int
    oldest_ready_age_ms: int

    @classmethod
    def from_pb(cls, q: pb.QueueStats) -> QueueStats:
        return cls(
            q.type,
            PRIORITY_NAMES.get(q.priority, "default"),
            q.delayed,
            q.ready,
            q.leased,
            q.dead,
            q.oldest_ready_age_ms,
        )


def dead_filter(job_type: str | None, reason: str | None) -> pb.DeadFilter:
    if reason and reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}: use one of {', '.join(REASONS)}")
    return pb.DeadFilter(type=job_type or "", reason=REASONS.get(reason or "", pb.DEAD_REASON_UNSPECIFIED))


@dataclass(frozen=True)
class DispatcherInfo:
    """A dispatcher process of the cluster, as the shard map lists it."""

    id: str
    #: Where workers and other dispatchers reach it.
    address: str
    alive: bool

    @classmethod
    def from_pb(cls, m: pb.Member) -> DispatcherInfo:
        return cls(id=m.id, address=m.address, alive=m.alive)


@dataclass(frozen=True)
class ShardInfo:
    shard: int
    #: The dispatcher that owns it now; "" while it has none (moving, or its owner died).
    owner: str
    #: The fencing epoch: it grows with every new owner, and a former owner's writes are refused.
    epoch: int
    #: The owner's address.
    address: str
    #: Its delayed, ready and leased jobs.
    pending: int
    #: The owner the assignment asks for (the owner once a move is done).
    assigned: str

    @classmethod
    def from_pb(cls, s: pb.ShardInfo) -> ShardInfo:
        return cls(
            shard=s.shard,
            owner=s.owner,
            epoch=s.epoch,
            address=s.address,
            pending=s.pending,
            assigned=s.assigned,
        )


@dataclass(frozen=True)
class ShardMap:
    """Which dispatcher owns which shard; a job type's shard is ``shardmap.shard_for(type, shard_count)``."""

    shard_count: int
    members: tuple[DispatcherInfo, ...]
    #: Ordered by shard.
    shards: tuple[ShardInfo, ...]

    @classmethod
    def from_pb(cls, view: pb.GetShardMapResponse) -> ShardMap:
        return cls(
            shard_count=view.shard_count,
            members=tuple(DispatcherInfo.from_pb(m) for m in view.members),
            shards=tuple(ShardInfo.from_pb(s) for s in view.shards),
        )


@dataclass(frozen=True)
class ShardMove:
    shard: int
    #: Its owner before the move ("" when it had none).
    source: str
    target: str
    #: Its jobs pending when the plan was made.
    pending: int

    @classmethod
    def from_pb(cls, m: pb.ShardMove) -> ShardMove:
        return cls(shard=m.shard, source=m.source, target=m.target, pending=m.pending)


@dataclass(frozen=True)
class RebalancePlan:
    moves: tuple[ShardMove, ...]
    #: False for a dry run: nothing moved.
    applied: bool

    @classmethod
    def from_pb(cls, r: pb.RebalanceResponse) -> RebalancePlan:
        return cls(moves=tuple(ShardMove.from_pb(m) for m in r.moves), applied=r.applied)


@dataclass(frozen=True)
class VersionInfo:
    #: The dispatcher's release.
    version: str
    #: The worker protocol's version.
    protocol: int
    shard_count: int

    @classmethod
    def from_pb(cls, v: pb.GetVersionResponse) -> VersionInfo:
        return cls(version=v.version, protocol=v.protocol, shard_count=v.shard_count)


@dataclass(frozen=True)
class TypeCounters:
    """A dispatcher process's cumulative counts for one job type since it started."""

    enqueued: int = 0
    #: Leases handed to workers.
    started: int = 0
    succeeded: int = 0
    #: Handler failures reported by workers.
    failed: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class StatsSnapshot:
    """Stats with the answering process's counters: rates are the difference of two snapshots of one
    process (the same ``dispatcher_id`` and ``started_at_ms``) over their ``sampled_at_ms``."""

    #: Depth by state, cluster-wide (empty when only the counters were asked for).
    queues: tuple[QueueStats, ...]
    dispatcher_id: str
    sampled_at_ms: int
    #: When the process began counting (another value: it restarted, its counters began anew).
    started_at_ms: int
    #: Job type -> its counters in this process.
    counters: dict[str, TypeCounters]
    #: Enqueue-to-start latency: bucket bounds in seconds and cumulative counts, +Inf last.
    latency_bounds_s: tuple[float, ...]
    latency_counts: tuple[int, ...]

    @classmethod
    def from_pb(cls, r: pb.StatsResponse) -> StatsSnapshot:
        return cls(
            queues=tuple(QueueStats.from_pb(q) for q in r.queues),
            dispatcher_id=r.dispatcher_id,
            sampled_at_ms=r.sampled_at_ms,
            started_at_ms=r.started_at_ms,
            counters={
                c.type: TypeCounters(c.enqueued, c.started, c.succeeded, c.failed, c.dead_lettered)
                for c in r.counters
            },
            latency_bounds_s=tuple(r.enqueue_to_start.bounds_s),
            latency_counts=tuple(r.enqueue_to_start.counts),
        )


@dataclass(frozen=True)
class WorkerInfo:
    """A worker stream connected to a dispatcher process."""

    worker_id: str
    job_types: tuple[str, ...]
    concurrency: int
    #: Leases it holds now.
    in_flight: int
    connected_at_ms: int
    #: Its last message (heartbeat, results or credit).
    last_seen_ms: int
    peer: str
    draining: bool
    #: The dispatcher process it is connected to.
    dispatcher_id: str

    @classmethod
    def from_pb(cls, w: pb.ConnectedWorker, dispatcher_id: str) -> WorkerInfo:
        return cls(
            worker_id=w.worker_id,
            job_types=tuple(w.job_types),
            concurrency=w.concurrency,
            in_flight=w.in_flight,
            connected_at_ms=w.connected_at_ms,
            last_seen_ms=w.last_seen_ms,
            peer=w.peer,
            draining=w.draining,
            dispatcher_id=dispatcher_id,
        )


@dataclass(frozen=True)
class Identity:
    """Who the client's token stands for, as the dispatcher sees it."""

    name: str
    #: producer, worker, viewer, admin or peer.
    role: str
    #: The token's job-type patterns; empty: every type.
    types: tuple[str, ...]
    #: False: the dispatcher checks no tokens (every caller is an anonymous admin).
    auth: bool

    @classmethod
    def from_pb(cls, r: pb.WhoAmIResponse) -> Identity:
        return cls(name=r.name, role=r.role, types=tuple(r.types), auth=r.auth)

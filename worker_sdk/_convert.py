"""Between Python values and protobuf messages, for both clients."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dispatcher._pb import shardq_pb2 as pb

PRIORITIES = {"high": pb.PRIORITY_HIGH, "default": pb.PRIORITY_DEFAULT, "low": pb.PRIORITY_LOW}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
STATUS_NAMES = {
    pb.JOB_STATUS_DELAYED: "delayed",
    pb.JOB_STATUS_READY: "ready",
    pb.JOB_STATUS_LEASED: "leased",
    pb.JOB_STATUS_SUCCEEDED: "succeeded",
    pb.JOB_STATUS_DEAD: "dead",
    pb.JOB_STATUS_CANCELLED: "cancelled",
    pb.JOB_STATUS_UNSPECIFIED: "unknown",
}
REASONS = {
    "handler_error": pb.DEAD_REASON_HANDLER_ERROR,
    "not_retryable": pb.DEAD_REASON_NOT_RETRYABLE,
    "lease_expired": pb.DEAD_REASON_LEASE_EXPIRED,
    "no_handler": pb.DEAD_REASON_NO_HANDLER,
}
REASON_NAMES = {v: k for k, v in REASONS.items()}
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
) -> pb.JobSpec:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}: use high, default or low")
    spec = pb.JobSpec(
        type=job_type,
        payload=encode_payload(payload),
        priority=PRIORITIES[priority],
        idempotency_key=idempotency_key or "",
    )
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
    return spec


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
    return pb.DeadFilter(type=job_type or "", reason=REASONS.get(reason or "", 0))

"""The job search and the bulk actions by filter: ``JobFilter`` (what both take), ``JobPage`` and
``BulkResult`` (what they return)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from shardq_common.pb import shardq_pb2 as pb

from ._convert import PRIORITIES, REASONS, JobInfo

STATUSES = {
    "delayed": pb.JOB_STATUS_DELAYED,
    "ready": pb.JOB_STATUS_READY,
    "leased": pb.JOB_STATUS_LEASED,
    "succeeded": pb.JOB_STATUS_SUCCEEDED,
    "dead": pb.JOB_STATUS_DEAD,
    "cancelled": pb.JOB_STATUS_CANCELLED,
    "waiting": pb.JOB_STATUS_WAITING,
}
#: What ``Client.bulk_jobs`` can do, and to which jobs: cancel (delayed, ready, leased), requeue
#: (dead), run_now (delayed: a first run in the future or a retry's backoff), delete (succeeded,
#: cancelled, dead).
BULK_ACTIONS = {
    "cancel": pb.BULK_ACTION_CANCEL,
    "requeue": pb.BULK_ACTION_REQUEUE,
    "run_now": pb.BULK_ACTION_RUN_NOW,
    "delete": pb.BULK_ACTION_DELETE,
}
_WILDCARDS = frozenset("*?[")
T = TypeVar("T")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a search or a bulk action selects: every field given must hold.

    ``types``: job types, any of them; one with a wildcard (``billing.*``, ``?``, ``[...]``) is a
    pattern. ``statuses``: delayed, ready, leased, succeeded, dead, cancelled,
    waiting. ``priorities``: high,
    default, low. ``created_after``/``created_before``, ``finished_after``/``finished_before``: aware
    datetimes or epoch seconds (after: at or after; before: strictly before). ``idempotency_key``,
    ``schedule``: exact. ``error_contains``: a substring of the last error (case-sensitive).
    ``payload``: ``{"customer_id": 42, "customer.region": "eu"}``, JSON fields of the payload
    (dotted paths) equal to these values; a payload that is not a JSON object never matches.
    ``dead_reason``: one of ``DEAD_REASONS``.
    """

    types: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    priorities: tuple[str, ...] = ()
    created_after: datetime | float | None = None
    created_before: datetime | float | None = None
    finished_after: datetime | float | None = None
    finished_before: datetime | float | None = None
    idempotency_key: str = ""
    schedule: str = ""
    error_contains: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    dead_reason: str = ""

    def to_pb(self) -> pb.JobFilter:
        types, patterns = _split(self.types)
        f = pb.JobFilter(
            types=types,
            type_patterns=patterns,
            statuses=[_named(STATUSES, s, "status") for s in _strings(self.statuses)],
            priorities=[_named(PRIORITIES, p, "priority") for p in _strings(self.priorities)],
            created_after_ms=_ms(self.created_after, "created_after"),
            created_before_ms=_ms(self.created_before, "created_before"),
            finished_after_ms=_ms(self.finished_after, "finished_after"),
            finished_before_ms=_ms(self.finished_before, "finished_before"),
            idempotency_key=self.idempotency_key,
            schedule=self.schedule,
            error_contains=self.error_contains,
            dead_reason=(
                _named(REASONS, self.dead_reason, "dead reason")
                if self.dead_reason
                else pb.DEAD_REASON_UNSPECIFIED
            ),
        )
        for path, value in self.payload.items():
            f.payload.add(path=path, value_json=json.dumps(value))
        return f


@dataclass(frozen=True)
class JobPage:
    """One page of a search, newest first unless asked otherwise."""

    jobs: list[JobInfo]
    #: Give it back as ``cursor`` (with the same filter and order) for the next page; "" on the last.
    next_cursor: str
    #: With ``with_total``: the matching jobs, exactly when ``total_exact``, else an estimate.
    total: int | None = None
    total_exact: bool = False

    @classmethod
    def from_pb(cls, reply: pb.ListJobsResponse, with_total: bool) -> JobPage:
        return cls(
            jobs=[JobInfo.from_pb(j) for j in reply.jobs],
            next_cursor=reply.next_cursor,
            total=int(reply.total) if with_total else None,
            total_exact=bool(reply.total_exact),
        )


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did (or, with dry_run, would do)."""

    #: The jobs the filter selected that the action applies to.
    matched: int
    #: The jobs it changed (0 with dry_run).
    touched: int
    #: It stopped at its limit: call again with ``after_id=last_id`` for the rest.
    more: bool
    #: The last job it selected ("" when none).
    last_id: str = ""

    @classmethod
    def from_pb(cls, reply: pb.BulkJobsResponse) -> BulkResult:
        return cls(int(reply.matched), int(reply.touched), bool(reply.more), reply.last_id)


def list_request(
    job_filter: JobFilter | None,
    limit: int,
    cursor: str,
    oldest_first: bool,
    max_payload_bytes: int,
    with_total: bool,
) -> pb.ListJobsRequest:
    return pb.ListJobsRequest(
        filter=(job_filter or JobFilter()).to_pb(),
        limit=limit,
        cursor=cursor,
        oldest_first=oldest_first,
        max_payload_bytes=max_payload_bytes,
        with_total=with_total,
    )


def bulk_request(
    action: str, job_filter: JobFilter | None, dry_run: bool, limit: int, after_id: str
) -> pb.BulkJobsRequest:
    return pb.BulkJobsRequest(
        action=_named(BULK_ACTIONS, action, "bulk action"),
        filter=(job_filter or JobFilter()).to_pb(),
        dry_run=dry_run,
        limit=limit,
        after_id=after_id,
    )


def _strings(values: Iterable[str] | str) -> list[str]:
    return [values] if isinstance(values, str) else list(values)


def _split(types: Iterable[str] | str) -> tuple[list[str], list[str]]:
    names: list[str] = []
    patterns: list[str] = []
    for t in _strings(types):
        (patterns if _WILDCARDS & set(t) else names).append(t)
    return names, patterns


def _named(table: Mapping[str, T], name: str, what: str) -> T:
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}: use one of {', '.join(table)}")
    return table[name]


def _ms(value: datetime | float | None, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{name} must be timezone-aware")
        value = value.timestamp()
    if not value >= 0:
        raise ValueError(f"{name} must be a time after 1970")
    return round(float(value) * 1000)

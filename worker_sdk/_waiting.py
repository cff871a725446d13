"""Waiting for a job: what both clients' ``watch`` and ``wait`` share (the WatchJob stream, resumed
after a lost connection or a dispatcher restart, and how a finished job becomes a result or an
error)."""

from __future__ import annotations

import json
from typing import Any

import grpc

from ._convert import JobInfo

#: A stream that fails with one of these is opened again (the dispatcher restarts, or its process
#: went away): the new stream's first event is the job as the DB has it, so nothing is missed.
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
FIRST_RETRY_S = 0.1
LAST_RETRY_S = 2.0


class JobNotSucceededError(Exception):
    """The job waited for ended without succeeding. ``job`` is how it ended (a :class:`JobInfo`)."""

    def __init__(self, job: JobInfo, message: str) -> None:
        super().__init__(message)
        self.job = job


class JobDeadError(JobNotSucceededError):
    """The job is dead (dead-letter queue): out of attempts, not retryable, or without a handler."""


class JobCancelledError(JobNotSucceededError):
    """The job was cancelled."""


def outcome(job: JobInfo) -> Any:
    """A finished job's result: the value its handler returned, decoded from JSON (bytes that are not
    JSON as they are; None without a result). Raises for a dead or cancelled job."""
    if job.status == "dead":
        error = job.last_error.strip().splitlines()[-1] if job.last_error else "no error recorded"
        raise JobDeadError(job, f"job {job.id} is dead ({job.dead_reason}): {error}")
    if job.status == "cancelled":
        raise JobCancelledError(job, f"job {job.id} was cancelled")
    if not job.result:
        return None
    try:
        return json.loads(job.result)
    except ValueError:
        return job.result


def timed_out(job_id: str, timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job_id} did not finish within {timeout} s")


def next_retry(delay: float) -> float:
    return min(delay * 2, LAST_RETRY_S)

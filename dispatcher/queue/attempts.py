"""Attempt history: what a run of a job writes to its row in job_attempts (migration 0012).

A run is one lease its worker received; it is numbered by ``Grant.run`` (charged attempts plus
rate-limited runs), which stays the same from the lease to its end whatever the end was, so a run's
start (recorded with the lease) and its end (with the ack, nack or expiry) meet in one row. Both go
through the status writer, coalesced with the job's status update: a run that ends within the lease
write delay costs one row write, in the batch that writes the job's status.
"""

from __future__ import annotations

from ..store import AttemptUpdate
from .states import JobState
from .working_set import Grant, Transition

_TRACEBACK_HEAD = "Traceback (most recent call last):"
_ELIDED = "...\n"


def started(grant: Grant, worker: str, now: int) -> AttemptUpdate:
    # A lease granted ahead of run_at goes to the worker at run_at (sessions.py): it starts then.
    return AttemptUpdate(grant.id, grant.run, worker=worker, started_at=max(now, grant.run_at_ms))


def succeeded(t: Transition, now: int) -> AttemptUpdate:
    return AttemptUpdate(t.id, t.run, finished_at=now, outcome="succeeded")


def nacked(t: Transition, now: int, text: str, *, rate_limited: bool, max_traceback: int) -> AttemptUpdate:
    """A run its worker reported failed (or rate limited, or stopped by a cancel)."""
    if rate_limited:
        outcome = "rate_limited"
    elif t.state is JobState.CANCELLED:
        outcome = "cancelled"
    else:
        outcome = "failed"
    error, traceback = split_error(text, max_traceback)
    return AttemptUpdate(t.id, t.run, finished_at=now, outcome=outcome, error=error, traceback=traceback)


def expired(t: Transition, now: int) -> AttemptUpdate:
    return AttemptUpdate(t.id, t.run, finished_at=now, outcome="lease_expired")


def split_error(text: str, max_traceback: int) -> tuple[str, str | None]:
    """A worker's error text as (error, traceback). A Python traceback's error is its last line (the
    exception); the traceback keeps its last ``max_traceback`` characters from a line's start, the
    frames nearest the error, behind a "..." line when cut. Other text is the error alone."""
    text = text.strip()
    if _TRACEBACK_HEAD not in text:
        return text, None
    error = text.rsplit("\n", 1)[-1].strip()
    if max_traceback <= 0:
        return error, None
    if len(text) <= max_traceback:
        return error, text
    tail = text[len(text) - (max_traceback - len(_ELIDED)) :].partition("\n")[2]
    return error, _ELIDED + tail

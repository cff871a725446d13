"""Attempt history: the runs of a job (migration 0012).

A run is one lease its worker received; it is numbered by ``Grant.run`` (charged attempts plus
rate-limited runs), which stays the same from its lease to its end whatever the end was. The job's
latest run is in its row: the lease's update writes its worker and start, the job's status and
finished_at say how it is going or how it ended. So a run that succeeds, the common case, costs no
write of its own; one that ends otherwise (failed, lease expired, cancelled, rate limited) is kept
as a row of job_attempts, written through the status writer with the job's status update, its start
taken from its lease's update (pending with it) or from the job's row. GetJob lists those rows and
the latest run from the job's row when it has none (``current_run``).
"""

from __future__ import annotations

from ..store import AttemptUpdate
from .states import JobState
from .working_set import Transition

_TRACEBACK_HEAD = "Traceback (most recent call last):"
_ELIDED = "...\n"


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


def caught_up(t: Transition, now: int) -> AttemptUpdate | None:
    """The end of a run that a reconcile found finished in Redis and not in the DB (its owner died
    before its status write): the outcome is known, the worker's error text is not. None when it
    succeeded (the job's row says so) or never ran."""
    if t.state is JobState.SUCCEEDED or not t.attempts:
        return None
    if t.state is JobState.CANCELLED:
        outcome = "cancelled"
    else:
        outcome = "lease_expired" if t.dead_reason == "lease_expired" else "failed"
    return AttemptUpdate(t.id, t.run, finished_at=now, outcome=outcome)


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

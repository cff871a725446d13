"""Job states, priority classes and dead-letter reasons: the vocabulary every layer shares.

The Lua scripts store ``JobState`` values in the job record's ``s`` field and
check the source state of every transition against this table.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class JobState(StrEnum):
    #: Waiting for run_at: a first run in the future, or a retry's backoff.
    DELAYED = "delayed"
    #: Due and waiting in its type's ready set for a worker.
    READY = "ready"
    #: Held by a worker under a lease with a token and a deadline.
    LEASED = "leased"
    #: Acked by a worker. Terminal.
    SUCCEEDED = "succeeded"
    #: Out of attempts or not retryable: in the dead-letter queue. Left only by a requeue.
    DEAD = "dead"
    #: Cancelled before it ran, or while running (then never retried). Terminal.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})
ACTIVE = frozenset({JobState.DELAYED, JobState.READY, JobState.LEASED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.DELAYED: frozenset({JobState.READY, JobState.CANCELLED}),
    JobState.READY: frozenset({JobState.LEASED, JobState.CANCELLED}),
    JobState.LEASED: frozenset(
        {JobState.SUCCEEDED, JobState.DELAYED, JobState.DEAD, JobState.CANCELLED, JobState.READY}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.DEAD: frozenset({JobState.DELAYED}),  # requeue from the dead-letter queue
    JobState.CANCELLED: frozenset(),
}


class Priority(IntEnum):
    """Priority classes, in the order strict priority serves them."""

    HIGH = 0
    DEFAULT = 1
    LOW = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown priority {name!r}: use high, default or low") from None


class DeadReason(StrEnum):
    #: The last attempt raised and failures + expirations reached max_attempts.
    HANDLER_ERROR = "handler_error"
    #: The handler marked its error as not retryable.
    NOT_RETRYABLE = "not_retryable"
    #: The last attempt's lease expired (worker crash, hang or disconnect).
    LEASE_EXPIRED = "lease_expired"
    #: The worker that got the job had no handler for its type.
    NO_HANDLER = "no_handler"


#: Priority by class number, for hot paths (a tuple index, not an enum lookup).
PRIORITIES = tuple(Priority)

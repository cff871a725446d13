"""Job states, priority classes, dead-letter reasons and the Lua scripts' result codes: the
vocabulary every layer shares.

The Lua scripts store ``JobState`` values in the job record's ``s`` field. They name states,
reasons and result codes through the ``codes`` include that scripting.py renders from the enums
here, so Python and Lua read one definition. ``TRANSITIONS`` is the state machine the scripts
implement; tests/integration/test_lua_state_machine.py fails on a transition it lacks.
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


# -- the Lua scripts' result codes -------------------------------------------------------------------
# Each script's reply, or its per-job entries, leads with one of these. Lua reads them as the tables
# of the ``codes`` include (scripting.LUA_CODE_TABLES names each table).


class FenceCode(IntEnum):
    """The whole reply of a fenced script (enqueue, peek_due, promote_delayed, lease, reap_leases,
    restore_jobs) called with an epoch that no longer owns the shard."""

    #: Stale epoch, or the shard lost by Redis.
    NOT_OWNER = -1


class EnqueueCode(IntEnum):
    """enqueue.lua, per job."""

    #: Already present, or cancelled before its push arrived.
    SKIPPED = 0
    READY = 1
    DELAYED = 2


class PeekCode(IntEnum):
    """peek_due.lua: the instant when nothing is delayed, the class of a listed id whose record is gone."""

    NONE = -1


class AckCode(IntEnum):
    """ack.lua, per lease."""

    #: The token does not hold the lease (stale, finished, unknown): nothing changed.
    STALE = 0
    SUCCEEDED = 1


class ExtendCode(IntEnum):
    """extend_lease.lua, per lease: the new deadline (negated when a cancel was requested), or this."""

    #: The token does not hold the lease (stale, finished, unknown).
    REJECTED = 0


class RetryCode(IntEnum):
    """retry.lua per nack, reap_leases.lua per expired lease: where the job went."""

    #: The token does not hold the lease: nothing changed (retry.lua only).
    STALE = 0
    DELAYED = 1
    DEAD = 2
    #: A cancel was requested while it ran.
    CANCELLED = 3


class ReturnCode(IntEnum):
    """return_leases.lua, per lease."""

    #: The token does not hold the lease: nothing changed.
    STALE = 0
    #: Ready again, the attempt not counted.
    READY = 1
    #: A cancel was requested meanwhile.
    CANCELLED = 2


class CancelCode(IntEnum):
    """cancel.lua."""

    #: Not in Redis: its push may be on the way, so the id is noted for the push to skip.
    NOTED = 0
    #: It was waiting (delayed or ready): it never runs.
    CANCELLED = 1
    #: It is leased: flagged, never retried; the reply's token names the lease to stop.
    RUNNING = 2
    #: Already succeeded, dead or cancelled (the reply's state says which).
    FINISHED = 3


class AcquireCode(IntEnum):
    """acquire_shard.lua."""

    ACQUIRED = 0
    #: Acquired a shard whose meta was missing (new, or lost by Redis): reconcile it.
    ACQUIRED_UNKNOWN = 1
    #: The shard already has an equal or higher epoch.
    STALE_EPOCH = -1
    #: Another owner holds an unexpired lease on it.
    HELD = -2


class EpochCode(IntEnum):
    """renew_shard.lua, release_shard.lua: whether the caller's epoch still owned the shard (then
    its lease was renewed, or released)."""

    CHANGED = 0
    CURRENT = 1

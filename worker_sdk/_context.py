"""What a handler receives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(slots=True)
class JobContext:
    """One execution of one job. Handlers must be idempotent: delivery is at-least-once."""

    #: The job's id (stable across attempts).
    job_id: str
    #: The job type (the handler name).
    type: str
    #: The payload bytes, exactly as enqueued. ``json()`` decodes a JSON payload.
    payload: bytes
    #: 1 on the first lease; retries and re-deliveries after a crash count up.
    attempt: int
    max_attempts: int
    #: Priority class: "high", "default" or "low".
    priority: str
    #: When the current lease ends unless heartbeats extend it (they are automatic), epoch ms.
    deadline_ms: int
    #: The idempotency key given at enqueue, or "".
    idempotency_key: str
    #: The time the job was due to run, epoch ms.
    run_at_ms: int
    #: The lease token: part of the fencing the dispatcher checks on ack.
    token: str
    shard: int
    # A plain flag: nothing waits on it, a sync handler polls it from its thread.
    _cancelled: bool = field(default=False, repr=False)

    @property
    def deadline(self) -> datetime:
        """When the current lease ends unless heartbeats extend it (they are automatic)."""
        return ms_to_datetime(self.deadline_ms)

    @property
    def run_at(self) -> datetime:
        """The time the job was due to run."""
        return ms_to_datetime(self.run_at_ms)

    def json(self) -> Any:
        return json.loads(self.payload) if self.payload else None

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, or its lease was lost: a sync handler should stop early."""
        return self._cancelled


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)

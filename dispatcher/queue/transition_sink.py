"""What follows a job's transition in this process, whichever path made it (push, lease, ack, nack,
expiry): the workers and the promoter that wait on it are woken, it is counted in the metrics, and
an expiry's status update goes to the status writer (ack and nack record their own, with the
result or error the worker sent)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from shardq_common.clock import wall_ms

from ..ops import metrics
from . import attempts
from .sessions import SessionRegistry
from .states import EnqueueCode, JobState
from .status_writer import LEASE_EXPIRED_ERROR, StatusWriter, transition_update
from .working_set import Grant, NewJob, Transition

log = structlog.get_logger("shardq.dispatcher")


class TransitionSink:
    def __init__(
        self,
        writer: StatusWriter,
        sessions: SessionRegistry,
        wake_promoter: Callable[[int, int | None], None],
    ) -> None:
        self.writer = writer
        self.sessions = sessions
        self.wake_promoter = wake_promoter  # (shard, run_at_ms): a job became delayed until then

    def pushed(self, shard: int, placed: list[tuple[NewJob, int]]) -> None:
        """New jobs are in the shard's queues, each ready or delayed (EnqueueCode), or skipped."""
        metrics.PUSHED.inc(sum(1 for _, p in placed if p != EnqueueCode.SKIPPED))
        ready = {(job.record.type, int(job.record.priority)) for job, p in placed if p == EnqueueCode.READY}
        if ready:
            self.sessions.notify_ready(shard, ready)
        delayed = [job.record.run_at_ms for job, p in placed if p == EnqueueCode.DELAYED]
        if delayed:
            self.wake_promoter(shard, min(delayed))

    def leased(self, grants: Sequence[Grant]) -> None:
        metrics.observe_leases(
            ((g.type, int(g.priority), g.enqueued_at_ms, g.run_at_ms, g.attempt) for g in grants), wall_ms()
        )

    def after(self, t: Transition) -> None:
        """A lease ended in a retry, a dead letter or a success: a retry's promoter looks again."""
        if t.state is JobState.DELAYED:
            self.wake_promoter(t.shard, t.run_at_ms)

    def finished(self, finished: Sequence[Transition], how: str) -> None:
        """Count transitions (each with the job type its script reported): how is "ack", "nack" or
        "expire"."""
        self.sessions.leases_ended((t.shard, t.job_type) for t in finished if t.job_type)
        counter = {"ack": metrics.ACKED, "nack": metrics.NACKED, "expire": metrics.EXPIRED}[how]
        labels = [(metrics.type_label(t.job_type or "unknown"), t) for t in finished]
        metrics.count(counter, ((label,) for label, _ in labels))
        metrics.count(
            metrics.DEAD,
            ((label, t.dead_reason or "unknown") for label, t in labels if t.state is JobState.DEAD),
        )

    def expired(self, transitions: list[Transition]) -> None:
        """A reaper expired these leases: their holders forget them, their updates are recorded."""
        now = wall_ms()
        for t in transitions:
            log.info(
                "lease expired",
                job=t.id,
                type=t.job_type,
                shard=t.shard,
                attempt=t.attempts,
                outcome=str(t.state),
                run_at=t.run_at_ms,
            )
            self.sessions.forget_lease(t.id)
            update = transition_update(t, now, error=LEASE_EXPIRED_ERROR)
            self.writer.record(t.shard, update, attempt=attempts.expired(t, now))
            self.after(t)
        self.finished(transitions, "expire")

"""Cancelling a job, wherever it is: waiting in Redis, leased to a worker of this process or of
another, on its way to Redis, or known only to the DB."""

from __future__ import annotations

from shardq_common.clock import wall_ms
from shardq_common.pb import shardq_pb2 as pb

from ..store import Store
from .lease_returns import LeaseReturns
from .sessions import SessionRegistry
from .states import CancelCode, JobState, Priority
from .status_writer import StatusWriter, transition_update
from .working_set import Transition, WorkingSet


class Canceller:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        writer: StatusWriter,
        sessions: SessionRegistry,
        returns: LeaseReturns,
    ) -> None:
        self.store = store
        self.working_set = working_set
        self.writer = writer
        self.sessions = sessions
        self.returns = returns

    async def cancel(self, job_id: str, shard: int, job_type: str, priority: int, db_status: str) -> str:
        """Cancel a job: one waiting never runs; a running one is told to stop and is not retried.
        Returns its status after: "cancelled", "leased" (running, will not be retried) or the
        terminal status it already had."""
        outcome = await self.working_set.cancel(shard, job_id, job_type, Priority(priority), wall_ms())
        if outcome.code is CancelCode.CANCELLED:
            self.writer.record(
                shard, transition_update(Transition(job_id, shard, JobState.CANCELLED), wall_ms())
            )
            await self.writer.flush()
            return "cancelled"
        if outcome.code is CancelCode.RUNNING:
            holder = self.sessions.holders.get(job_id)
            if holder is not None:
                grant = holder.withdraw(job_id)
                if grant is not None:  # leased ahead of its run_at, not sent yet: it never runs
                    await self.returns.return_unsent(holder, [grant])
                    await self.writer.flush()
                    return "cancelled"
                ref = pb.LeaseRef(job_id=job_id, token=outcome.token, shard=shard)
                holder.send(pb.DispatcherMessage(cancel=pb.Cancel(ref=ref)))
            return "leased"
        if outcome.code is CancelCode.FINISHED:
            return str(outcome.state)
        if db_status in ("succeeded", "dead", "cancelled"):
            return db_status
        # Redis does not hold it: its push is on the way, or it finished and Redis forgot it once its
        # status was committed, possibly after db_status was read. The row decides, read afresh.
        if self.writer.is_pending(job_id):
            await self.writer.flush()
        return await self.store.set_cancelled(job_id) or "cancelled"

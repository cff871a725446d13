"""The leases a worker stream gives back: those withdrawn before their messages went out are
returned to their queues at once (as if never leased), and those the worker held when its stream
ended lapse after the reconnect grace unless it reclaims them on a new stream first."""

from __future__ import annotations

from collections.abc import Callable

from shardq_common.clock import steady_ms, wall_ms

from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from .sessions import SessionRegistry, WorkerSession
from .states import JobState
from .status_writer import StatusWriter, returned_update
from .working_set import Grant, WorkingSet


class LeaseReturns:
    def __init__(
        self,
        working_set: WorkingSet,
        writer: StatusWriter,
        sessions: SessionRegistry,
        wake_reaper: Callable[[int], None],
        reconnect_grace_ms: int,
    ) -> None:
        self.working_set = working_set
        self.writer = writer
        self.sessions = sessions
        self.wake_reaper = wake_reaper  # (shard): lease deadlines in it were shortened
        self.reconnect_grace_ms = reconnect_grace_ms

    async def close_session(self, session: WorkerSession) -> None:
        """The stream ended. Unless we are shutting down (the worker will reclaim its leases from the
        next process), its leases lapse after the reconnect grace unless it reconnects first."""
        session.close()
        self.sessions.remove(session)
        await self.return_unsent(session, session.withdraw_all())  # leases the worker never received
        if session.held and not self.sessions.stopping:
            await self.release(
                session.stream_id, [(job_id, token, shard) for job_id, (token, shard) in session.held.items()]
            )
        session.log.info("worker disconnected", held=len(session.held))

    async def return_unsent(self, session: WorkerSession, grants: list[Grant]) -> None:
        """Leases withdrawn from ``session`` before their messages went out: their jobs are ready again
        as if never leased (or cancelled, if that was asked)."""
        by_shard: dict[int, list[Grant]] = {}
        for g in grants:
            by_shard.setdefault(g.shard, []).append(g)
        for shard, group in by_shard.items():
            try:
                results = await self.working_set.return_leases(
                    shard, [(g.id, g.token, g.type, g.priority) for g in group]
                )
            except REDIS_ERRORS as exc:
                note_redis_error("return_unsent", exc, shard=shard)  # the leases expire instead
                continue
            now = wall_ms()
            returned = [(g, t) for g, t in zip(group, results, strict=True) if t is not None]
            for g, t in returned:
                self.writer.record(shard, returned_update(t, now))
                session.log.info("unsent lease returned", job=g.id, type=g.type, outcome=str(t.state))
            metrics.count(metrics.RETURNED, ((metrics.type_label(g.type), str(t.state)) for g, t in returned))
            ready = [(g.type, int(g.priority)) for g, t in returned if t.state is JobState.READY]
            if ready:
                self.sessions.notify_ready(shard, ready)
            # a cancelled one freed its slot too, for workers a concurrency limit held back
            self.sessions.leases_ended((shard, g.type) for g, _ in returned)

    async def release(self, stream_id: str, refs: list[tuple[str, str, int]]) -> None:
        """The stream ``stream_id`` ended: of these leases, those it still holds lapse after the
        reconnect grace (Redis knows which: the worker may have reclaimed some on a newer stream)."""
        until = steady_ms() + self.reconnect_grace_ms
        by_shard: dict[int, list[tuple[str, str]]] = {}
        for job_id, token, shard in refs:
            by_shard.setdefault(shard, []).append((job_id, token))
        for shard, pairs in by_shard.items():
            try:
                await self.working_set.shorten(shard, until, stream_id, pairs)
            except REDIS_ERRORS as exc:
                note_redis_error("release_leases", exc, shard=shard)
                continue  # the full TTL still bounds them
            self.wake_reaper(shard)

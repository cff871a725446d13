"""The Dispatcher: wires the store, the working set and the per-shard loops of one process."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import structlog

from shardq_common.clock import steady_ms, wall_ms
from shardq_common.errors import ConfigError, InvalidArgument, NotOwner
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.tls import ChannelSecurity

from .cluster.coordinator import Coordinator
from .cluster.peers import Peers
from .config import Settings
from .ops import metrics, redis_client
from .ops.redis_errors import REDIS_ERRORS
from .ops.redis_faults import note_redis_error
from .queue.ingest import Ingestor
from .queue.keys import CLUSTER_KEY, DIRTY_KEY
from .queue.ownership import Ownership
from .queue.promoter import Promoter
from .queue.reaper import Reaper
from .queue.reconciler import Reconciler
from .queue.sessions import RESULTS_GRACE_S, SessionRegistry, WorkerSession
from .queue.states import CancelCode, EnqueueCode, JobState, Priority
from .queue.status_writer import LEASE_EXPIRED_ERROR, StatusWriter, returned_update, transition_update
from .queue.working_set import Grant, NewJob, Transition, WorkingSet
from .schedules import file as schedules_file
from .schedules.scheduler import Scheduler
from .store import Store

QUEUE_BEHIND_GRACE_S = 10.0
# run_at is wall time: a host this far from Redis's clock runs delayed jobs early or late
CLOCK_APART_WARN_MS = 1000
log = structlog.get_logger("shardq.dispatcher")


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        redis: Any,
        store: Store,
        advertise: str,
        peers: ChannelSecurity | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.store = store
        self.advertise = advertise
        self.dispatcher_id = settings.member_id(advertise)
        self.working_set = WorkingSet(redis)
        self.writer = StatusWriter(store, self.working_set, settings.flush_interval_ms)
        self.ownership = Ownership(
            self.dispatcher_id,
            store,
            self.working_set,
            settings.ownership_ttl_ms,
            self._on_acquired,
            self._on_lost,
        )
        self.coordinator = Coordinator(self)
        self.peers = Peers(peers)
        self.reconciler = Reconciler(store, self.working_set, self.writer, self.wake_promoter)
        self.sessions = SessionRegistry()
        self.ingest = Ingestor(
            settings.shard_count,
            store,
            self.working_set,
            self.ownership,
            self._on_pushed,
            self._on_push_failed,
            self.hand_off,
            max_request_bytes=settings.max_request_bytes,
        )
        self.scheduler = Scheduler(self)
        self.promoters: dict[int, Promoter] = {}
        self.reapers: dict[int, Reaper] = {}
        self._shard_tasks: dict[int, list[asyncio.Task[Any]]] = {}
        self.stopping = False
        self.counters: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[Any]] = []
        self._needs_reconcile: set[int] = set()
        self._unflagged: set[int] = set()  # shards to flag in DIRTY_KEY once Redis takes the write
        self._flagging: asyncio.Future[None] | None = None
        self._reconciles: dict[int, asyncio.Task[None]] = {}
        self._background: set[asyncio.Future[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # Before any deadline is taken: other processes compare the ones this one writes to Redis.
        if await redis_client.anchor_steady_clock(self.redis):
            apart_ms = wall_ms() - steady_ms()
            (log.warning if abs(apart_ms) > CLOCK_APART_WARN_MS else log.info)(
                "steady clock anchored on redis time", wall_clock_ahead_ms=apart_ms
            )
        applied = await self.store.migrate()
        if applied:
            log.info("database migrated", applied=applied)
        await self.store.ensure_shard_count(self.settings.shard_count)
        await self._check_redis_shard_count()
        await self._declare_schedules()
        self.writer.start()
        self.ingest.commit.start()
        await self.coordinator.join()
        self._tasks.append(asyncio.create_task(self.coordinator.run(), name="coordinator"))
        self._tasks.append(asyncio.create_task(self._reconcile_loop(), name="reconcile"))
        self._tasks.append(asyncio.create_task(self.scheduler.run(), name="scheduler"))
        log.info(
            "dispatcher started",
            id=self.dispatcher_id,
            address=self.advertise,
            shards=self.settings.shard_count,
            owned=len(self.ownership.epochs),
        )

    async def stop(self) -> None:
        """Stop leasing, tell workers to reconnect later (their leases stay valid: tokens live in
        Redis), release the shards so the other members take them at once, commit status."""
        self.stopping = True
        self.coordinator.stopping()
        for session in self.sessions.all():
            session.send(pb.DispatcherMessage(redirect=pb.Redirect(reason="dispatcher shutting down")))
            session.close()
        # Their last results are read until each worker half-closes; they reach the status writer,
        # which commits them below.
        await self.sessions.all_closed(RESULTS_GRACE_S + 1)
        await _cancel_all([*self._tasks, *self._reconciles.values()])
        self._tasks.clear()
        await self.ingest.commit.stop()
        await self.ingest.settle(QUEUE_BEHIND_GRACE_S)  # what is left, the shards' next owners reconcile
        await self.coordinator.leave()
        await self.writer.stop()
        await self.peers.close()
        log.info("dispatcher stopped", id=self.dispatcher_id)

    async def _declare_schedules(self) -> None:
        if not self.settings.schedules_file:
            return
        for i, spec in enumerate(schedules_file.load(self.settings.schedules_file)):
            try:
                await self.scheduler.declare(spec, f"{self.settings.schedules_file}: schedule #{i + 1}")
            except InvalidArgument as exc:
                raise ConfigError(str(exc)) from None

    async def _check_redis_shard_count(self) -> None:
        await self.redis.hsetnx(CLUSTER_KEY, "shard_count", self.settings.shard_count)
        recorded = int(await self.redis.hget(CLUSTER_KEY, "shard_count"))
        if recorded != self.settings.shard_count:
            raise ConfigError(
                f"Redis holds a cluster of {recorded} shards; this dispatcher has {self.settings.shard_count}"
            )

    async def _on_acquired(self, shard: int, epoch: int) -> None:
        tasks = self._shard_tasks.get(shard)
        if tasks and not any(t.done() for t in tasks):
            self.promoters[shard].wake()
        else:
            self.promoters[shard] = Promoter(
                shard,
                self.working_set,
                self.ownership,
                self.sessions.notify_ready,
                ahead_ms=self.settings.lease_ahead_ms,
            )
            self.reapers[shard] = Reaper(
                shard, self.working_set, self.ownership, self.settings.retry, self._on_expired
            )
            self._shard_tasks[shard] = [
                asyncio.create_task(self.promoters[shard].run(), name=f"promote-{shard}"),
                asyncio.create_task(self.reapers[shard].run(), name=f"reap-{shard}"),
            ]
        self._reconcile_soon(shard)
        self.sessions.notify_shard(shard)

    async def _on_lost(self, shard: int) -> None:
        """Stop the shard's loops and send its workers where the shard went (their leases stay valid)."""
        tasks = self._shard_tasks.pop(shard, [])
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)
        if self.stopping:
            return
        for session in list(self.sessions.by_shard.get(shard, ())):
            session.send(pb.DispatcherMessage(redirect=pb.Redirect(reason=f"shard {shard} moved")))
            session.close()

    async def shard_epoch(self, shard: int) -> int:
        """The shard's current epoch, ours or its owner's: for rare admin writes (requeue) from any member."""
        epoch = self.ownership.epochs.get(shard)
        if epoch is not None:
            return epoch
        metas = await self.working_set.metas([shard])
        if shard not in metas:
            raise NotOwner(f"shard {shard} has no owner right now; try again")
        return metas[shard][1]

    async def reconcile_now(self, shard: int) -> None:
        """Start reconciling the shard (see _reconcile_soon); returns at once."""
        self._reconcile_soon(shard)

    def _reconcile_soon(self, shard: int) -> None:
        """Reconcile the shard in a task of its own: a large shard takes many ownership TTLs, and the
        coordinator's tick (heartbeat, renewals, placement) must not wait on it. A request while one
        runs is kept for after it (its pages may be past the jobs that prompted the request)."""
        running = self._reconciles.get(shard)
        if running is not None and not running.done():
            self._needs_reconcile.add(shard)
            return
        self._needs_reconcile.discard(shard)
        self._reconciles[shard] = asyncio.create_task(self._reconcile(shard), name=f"reconcile-{shard}")

    async def _reconcile(self, shard: int) -> None:
        epoch = self.ownership.epochs.get(shard)
        if epoch is None:
            return

        def still_owner() -> bool:
            return self.ownership.epochs.get(shard) == epoch

        try:
            try:
                await self.reconciler.reconcile(shard, epoch, still_owner)
            except NotOwner:
                self._reconciles.pop(shard, None)  # a recovery reconciles the shard again, from the start
                await self.ownership.recover(shard, epoch)
        except REDIS_ERRORS as exc:
            note_redis_error("reconcile", exc, shard=shard)
            self._needs_reconcile.add(shard)  # tried again by _reconcile_loop
        except Exception as exc:
            log.warning("reconcile failed", shard=shard, error=str(exc))
            self._needs_reconcile.add(shard)

    def reconcile_soon(self, shards: Iterable[int]) -> None:
        """Restore these shards from the DB now (those this process owns), each in the background."""
        for shard in shards:
            if shard in self.ownership.epochs:
                self._reconcile_soon(shard)

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
                    await self.return_unsent(holder, [grant])
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

    async def hand_off(self, shard: int, jobs: list[NewJob]) -> None:
        """Committed jobs of a shard another process owns: ask the owner to queue them. When that
        fails, flag the shard so its owner reconciles it from the DB (the jobs are safe there).
        Never raises: the jobs are committed, so the enqueue answers OK whatever fails here."""
        address = None
        try:
            address = self.coordinator.view.address_of_owner(shard)
            if not address:  # the view may predate the shard's current owner: read it again
                address = (await self.coordinator.refresh()).address_of_owner(shard)
            if address and address != self.advertise:
                request = pb.PushJobsRequest(
                    shard=shard,
                    jobs=[pb.PushedJob(id=j.id, record=j.record.pack(), payload=j.payload) for j in jobs],
                )
                await self.peers.shard_service(address).PushJobs(
                    request, timeout=5, metadata=self.peers.metadata
                )
                return
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "hand-off to the shard owner failed", shard=shard, owner=address, code=exc.code().name
            )
        except Exception as exc:
            log.warning("hand-off to the shard owner failed", shard=shard, owner=address, error=repr(exc))
        self.flag_for_reconcile(shard)

    def flag_for_reconcile(self, shard: int) -> None:
        """Have the shard's owner, whichever process it is, reconcile it from the DB soon: committed
        jobs of it may be missing from Redis. The flag lives in Redis; while Redis refuses it, it is
        retried in the background (and this process reconciles the shard itself if it owns it)."""
        self._needs_reconcile.add(shard)
        self._unflagged.add(shard)
        if self._flagging is None or self._flagging.done():
            self._flagging = asyncio.ensure_future(self._flag_unflagged())
            self.background(self._flagging)

    async def _flag_unflagged(self) -> None:
        delay = 0.05
        while self._unflagged:
            shards = sorted(self._unflagged)
            try:
                await self.redis.sadd(DIRTY_KEY, *shards)
            except Exception as exc:
                if delay == 0.05:
                    log.warning("cannot flag shards for reconcile yet", shards=shards, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._unflagged.difference_update(shards)
            self.coordinator.wake()

    async def _reconcile_loop(self) -> None:
        last_full = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(1.0)
            full = asyncio.get_running_loop().time() - last_full >= self.settings.reconcile_interval_s
            shards = (
                set(self.ownership.epochs) if full else self._needs_reconcile & set(self.ownership.epochs)
            )
            if full:
                last_full = asyncio.get_running_loop().time()
            for shard in sorted(shards):
                self._reconcile_soon(shard)

    # -- events from the loops and streams ------------------------------------------------

    def _on_pushed(self, shard: int, placed: list[tuple[NewJob, int]]) -> None:
        self.counters["enqueued"] += len(placed)
        ready = {(job.record.type, int(job.record.priority)) for job, p in placed if p == EnqueueCode.READY}
        if ready:
            self.sessions.notify_ready(shard, ready)
        delayed = [job.record.run_at_ms for job, p in placed if p == EnqueueCode.DELAYED]
        if delayed:
            self.wake_promoter(shard, min(delayed))

    def _on_push_failed(self, shard: int) -> None:
        self._needs_reconcile.add(shard)
        if not self.ownership.owns(shard):  # another process's: only the flag reaches its owner
            self.flag_for_reconcile(shard)

    def _on_expired(self, transitions: list[Transition]) -> None:
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
            holder = self.sessions.holders.get(t.id)
            if holder is not None:
                holder.forget(t.id)
            self.writer.record(t.shard, transition_update(t, now, error=LEASE_EXPIRED_ERROR))
            self.after_transition(t)
            self.counters["expired"] += 1
        self.metrics_finished([(t, t.job_type) for t in transitions], "expire")

    def lease_deadline(self, shard: int, deadline_ms: int) -> None:
        """Leases were granted: the shard's reaper looks again by their earliest deadline."""
        reaper = self.reapers.get(shard)
        if reaper is not None:
            reaper.wake(deadline_ms)

    def background(self, task: asyncio.Future[Any]) -> None:
        """Keep a reference to a fire-and-forget task until it ends (the loop only keeps weak ones)."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def wake_promoter(self, shard: int, run_at_ms: int | None = None) -> None:
        promoter = self.promoters.get(shard)
        if promoter is not None:
            promoter.wake(run_at_ms)

    def after_transition(self, t: Transition) -> None:
        if t.state is JobState.DELAYED:
            self.wake_promoter(t.shard, t.run_at_ms)

    def metrics_leased(self, grants: Sequence[Grant]) -> None:
        self.counters["leased"] += len(grants)
        metrics.observe_leases(
            ((g.type, int(g.priority), g.enqueued_at_ms, g.run_at_ms, g.attempt) for g in grants), wall_ms()
        )

    def metrics_finished(self, finished: Sequence[tuple[Transition, str]], how: str) -> None:
        """Count transitions, given with their job types: how is "ack", "nack" or "expire"."""
        counter = {"ack": metrics.ACKED, "nack": metrics.NACKED, "expire": metrics.EXPIRED}[how]
        labels = [(metrics.type_label(job_type or "unknown"), t) for t, job_type in finished]
        self.counters.update(str(t.state) for t, _ in finished)
        metrics.count(counter, ((label,) for label, _ in labels))
        metrics.count(
            metrics.DEAD,
            ((label, t.dead_reason or "unknown") for label, t in labels if t.state is JobState.DEAD),
        )

    async def close_session(self, session: WorkerSession) -> None:
        """The stream ended. Unless we are shutting down (the worker will reclaim its leases from the
        next process), its leases lapse after the reconnect grace unless it reconnects first."""
        session.close()
        self.sessions.remove(session)
        await self.return_unsent(session, session.withdraw_all())  # leases the worker never received
        if session.held and not self.stopping:
            await self.release_leases(
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

    async def release_leases(self, stream_id: str, refs: list[tuple[str, str, int]]) -> None:
        """The stream ``stream_id`` ended: of these leases, those it still holds lapse after the
        reconnect grace (Redis knows which: the worker may have reclaimed some on a newer stream)."""
        until = steady_ms() + self.settings.reconnect_grace_ms
        by_shard: dict[int, list[tuple[str, str]]] = {}
        for job_id, token, shard in refs:
            by_shard.setdefault(shard, []).append((job_id, token))
        for shard, pairs in by_shard.items():
            try:
                await self.working_set.shorten(shard, until, stream_id, pairs)
            except REDIS_ERRORS as exc:
                note_redis_error("release_leases", exc, shard=shard)
                continue  # the full TTL still bounds them
            if shard in self.reapers:
                self.reapers[shard].wake()


async def _cancel_all(tasks: list[asyncio.Task[Any]], timeout: float = 5.0) -> None:
    """Cancel and await the tasks; one that will not finish is reported with its stack, not waited on."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        frames = [f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in task.get_stack()]
        log.error("task did not stop when cancelled", task=task.get_name(), stack=frames)

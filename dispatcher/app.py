"""The Dispatcher: the composition root of one process. It builds the store's and Redis's
collaborators, hands each exactly what it uses, starts them in order and stops them in reverse."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from shardq_common.clock import steady_ms, wall_ms
from shardq_common.errors import ConfigError, InvalidArgument
from shardq_common.tls import ChannelSecurity

from .cluster.coordinator import Coordinator
from .cluster.handoff import HandOff
from .cluster.peers import Peers
from .config import Settings
from .ops import redis_client
from .ops.tracing import spans
from .queue import flow_file
from .queue.cancel import Canceller
from .queue.enqueue_streams import EnqueueStreams
from .queue.flow_mirror import FlowMirror
from .queue.flow_settings import FlowSettings, fields_of
from .queue.ingest import Ingestor
from .queue.keys import CLUSTER_KEY
from .queue.lease_returns import LeaseReturns
from .queue.ownership import Ownership
from .queue.pruner import Retention
from .queue.reconcile_loop import ReconcileLoop
from .queue.reconciler import Reconciler
from .queue.sessions import RESULTS_GRACE_S, SessionContext, SessionRegistry
from .queue.shard_loops import ShardLoops
from .queue.sql_enqueues import SqlEnqueues
from .queue.status_writer import StatusWriter
from .queue.table_keeper import TableKeeper
from .queue.transition_sink import TransitionSink
from .queue.watches import Watches
from .queue.working_set import WorkingSet
from .schedules import file as schedules_file
from .schedules.scheduler import Scheduler
from .store import Store

QUEUE_BEHIND_GRACE_S = 10.0
# How long a stop waits for the jobs the enqueue streams have read to commit and be answered.
ENQUEUE_STREAMS_GRACE_S = 5.0
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
        spans.configure(settings.trace_spans)  # refused here, at start, without opentelemetry-api
        self.settings = settings
        self.redis = redis
        self.store = store
        self.advertise = advertise
        self.dispatcher_id = settings.member_id(advertise)
        self.working_set = WorkingSet(redis)
        self.watches = Watches(settings.max_watches)
        self.enqueue_streams = EnqueueStreams()
        self.writer = StatusWriter(
            store,
            self.working_set,
            settings.flush_interval_ms,
            attempt_history=settings.attempt_history,
            watches=self.watches,
        )
        self.ownership = Ownership(
            self.dispatcher_id,
            store,
            self.working_set,
            settings.ownership_ttl_ms,
            self._on_acquired,
            self._on_lost,
            lambda shard: self.flow_mirror.before_serving(shard),
            reconnect_grace_ms=settings.reconnect_grace_ms,
        )
        self.sessions = SessionRegistry()
        self.flow_mirror = FlowMirror(
            store,
            redis,
            settings.shard_count,
            lambda: list(self.ownership.epochs),
            self.sessions.notify_shard,
        )
        self.flow = FlowSettings(store, self.flow_mirror)
        self.retention = Retention(
            store, settings.retention, settings.shard_count, settings.partitions.interval_s
        )
        self.table_keeper = TableKeeper(
            store, self.working_set, self.retention, settings.partitions, settings.shard_count
        )
        # The reaper's expiries go to the transition sink, which wakes the promoters: one is made
        # before the other, so the reapers reach the sink through this callback.
        self.loops = ShardLoops(
            self.working_set,
            self.ownership,
            settings.retry,
            settings.lease_ahead_ms,
            self.sessions.notify_ready,
            lambda expired: self.transitions.expired(expired),
            self.retention,
        )
        self.transitions = TransitionSink(self.writer, self.sessions, self.loops.wake_promoter)
        self.reconciler = Reconciler(store, self.working_set, self.writer, self.loops.restored)
        self.reconciles = ReconcileLoop(self.reconciler, self.ownership, settings.reconcile_interval_s)
        self.returns = LeaseReturns(
            self.working_set, self.writer, self.sessions, self.loops.wake_reaper, settings.reconnect_grace_ms
        )
        self.session_context = SessionContext(
            settings,
            self.sessions,
            self.ownership,
            self.working_set,
            self.writer,
            self.loops.lease_deadline,
            self.transitions.leased,
            self.returns.return_unsent,
            store.dependency_results,
        )
        self.canceller = Canceller(store, self.working_set, self.writer, self.sessions, self.returns)
        self.coordinator = Coordinator(
            self.dispatcher_id,
            advertise,
            redis,
            self.working_set,
            self.ownership,
            self.reconciles,
            settings.shard_count,
            settings.ownership_ttl_ms,
        )
        self.peers = Peers(peers)
        self.hand_off = HandOff(
            advertise, redis, self.working_set, self.coordinator, self.peers, self.ownership, self.reconciles
        )
        self.ingest = Ingestor(
            settings.shard_count,
            store,
            self.working_set,
            self.ownership,
            self.transitions.pushed,
            self.hand_off.push_failed,
            self.hand_off.hand_off,
            max_request_bytes=settings.max_request_bytes,
        )
        # Jobs a commit of this process released from 'waiting' (issue 21) go to Redis through the
        # enqueue path's push (their shard's owner, by hand-off when it is another process).
        store.on_resolved = self.ingest.push_resolved
        self.sql_enqueues = SqlEnqueues(
            store, self.ownership, self.writer, self.ingest, settings.sql_enqueue_sweep_s
        )
        self.scheduler = Scheduler(settings, store, self.ownership, self.ingest, self.canceller)
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def stopping(self) -> bool:
        """True from the start of stop(): the sessions keep the flag, since they act on it."""
        return self.sessions.stopping

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
        await self.store.record_enqueue_settings(
            {
                "max_payload_bytes": self.settings.max_payload_bytes,
                "max_attempts": self.settings.max_attempts,
                "lease_ttl_ms": self.settings.lease_ttl_ms,
                "max_batch": self.settings.max_batch,
            }
        )
        await self._check_redis_shard_count()
        # Before any job is taken: its row needs the partition of its id. A refusal (a lock not
        # granted in time) is not fatal: the default partition takes the rows meanwhile, and the
        # keeper moves them into the partition it creates at a later pass.
        try:
            await self.table_keeper.ensure_ahead()
        except Exception as exc:
            log.warning("partitions not created at start: the table keeper tries again", error=str(exc))
        await self._declare_schedules()
        await self._declare_queues()
        # Before any shard is acquired: each is served only once its settings are in Redis.
        await self.flow_mirror.load()
        self.writer.start()
        self.ingest.commit.start()
        await self.coordinator.join()
        self._tasks.append(asyncio.create_task(self.coordinator.run(), name="coordinator"))
        self._tasks.append(asyncio.create_task(self.reconciles.run(), name="reconcile"))
        self._tasks.append(asyncio.create_task(self.scheduler.run(), name="scheduler"))
        self._tasks.append(asyncio.create_task(self.flow_mirror.run(), name="flow-mirror"))
        self._tasks.append(asyncio.create_task(self.sql_enqueues.run(), name="sql-enqueues"))
        self._tasks.append(asyncio.create_task(self.table_keeper.run(), name="table-keeper"))
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
        self.sessions.shut_down()
        self.watches.close()  # watchers reconnect now (elsewhere, or here once restarted)
        # Before the group commit stops: the jobs the streams have read are committed and answered.
        await self.enqueue_streams.close(ENQUEUE_STREAMS_GRACE_S)
        self.coordinator.stopping()
        # Their last results are read until each worker half-closes; they reach the status writer,
        # which commits them below.
        await self.sessions.all_closed(RESULTS_GRACE_S + 1)
        await _cancel_all([*self._tasks, *self.reconciles.tasks(), *self.sql_enqueues.tasks()])
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

    async def _declare_queues(self) -> None:
        """The queue settings of SHARDQ_QUEUES_FILE: the fields each entry gives are set, the others
        keep what the DB holds (a pause made from the command line survives a restart)."""
        if not self.settings.queues_file:
            return
        for job_type, (given, names) in flow_file.load(self.settings.queues_file).items():
            try:
                await self.flow.change(
                    job_type,
                    fields_of(given, names),
                    field_prefix=f"{self.settings.queues_file}: [queues.{job_type}] ",
                )
            except InvalidArgument as exc:
                raise ConfigError(str(exc)) from None

    async def _check_redis_shard_count(self) -> None:
        await self.redis.hsetnx(CLUSTER_KEY, "shard_count", self.settings.shard_count)
        recorded = int(await self.redis.hget(CLUSTER_KEY, "shard_count"))
        if recorded != self.settings.shard_count:
            raise ConfigError(
                f"Redis holds a cluster of {recorded} shards; this dispatcher has {self.settings.shard_count}"
            )

    # -- what ownership changes set in motion ---------------------------------------------

    async def _on_acquired(self, shard: int, epoch: int, redis_lost_it: bool) -> None:
        """Run the shard's loops, restore it from the DB, and have its workers look at it."""
        self.loops.start(shard)
        self.reconciles.soon(shard, after_loss=redis_lost_it)
        self.sql_enqueues.soon(shard)
        self.sessions.notify_shard(shard)

    async def _on_lost(self, shard: int) -> None:
        """Stop the shard's loops and send its workers where the shard went (their leases stay valid)."""
        await self.loops.stop(shard)
        if not self.sessions.stopping:
            self.sessions.shard_moved(shard)


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

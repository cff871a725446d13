"""Jobs that producers enqueued in their own PostgreSQL transactions (shardq_enqueue_v1 and
shardq_enqueue_many_v1, migration 0008; shardq_enqueue_v2 and shardq_enqueue_many_v2, migration 0010,
which also take a concurrency key and headers), pushed to Redis by the owner of their shard. The
push builds each record from the whole row (record_from_row), key and headers included.

The functions insert the job rows, note each new job in jobs_to_push and notify the shard on the
channel ``shardq_enqueued``; PostgreSQL delivers a notification only when its transaction commits,
so a job rolled back is never seen here. On a notification for a shard it owns, this process reads
the shard's noted jobs and pushes them as it pushes the jobs of its own enqueues (Ingestor.push: a
Redis refusal or a lost shard notes them unpushed and has the reconciler restore them), then drops
their notes. A notification can be missed (this process was down at the commit, its LISTEN
connection was lost): a sweep of every owned shard's notes every ``sweep_interval_s``, on every
(re)connection of the listener and on every acquisition of a shard pushes what is left.

A job is never pushed after it finished: the push reads the rows while the status writer holds the
jobs' records in Redis (forgets_held), so a job that finished is either still in Redis (the push
skips it) or its row says so (it is not pushed). Pushing a job twice queues it once.
"""

from __future__ import annotations

import asyncio

import structlog

from shardq_common.clock import wall_ms
from shardq_common.errors import StoreUnavailable

from ..ops import metrics
from ..store import Store
from .ingest import PUSH_CHUNK, Ingestor
from .ownership import Ownership
from .reconciler import record_from_row
from .states import ACTIVE
from .status_writer import StatusWriter
from .working_set import NewJob

log = structlog.get_logger("shardq.sql_enqueues")
LISTEN_RETRY_MAX_S = 5.0


class SqlEnqueues:
    def __init__(
        self,
        store: Store,
        ownership: Ownership,
        writer: StatusWriter,
        ingest: Ingestor,
        sweep_interval_s: float,
    ) -> None:
        self.store = store
        self.ownership = ownership
        self.writer = writer
        self.ingest = ingest
        self.sweep_interval_s = sweep_interval_s
        self.pushed_total = 0
        self._wanted: set[int] = set()  # shards to read again once their running push ends
        self._running: dict[int, asyncio.Task[None]] = {}
        self._sweeps: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self.store.supports_sql_enqueue

    def soon(self, shard: int) -> None:
        """Push the shard's jobs enqueued by SQL, should this process own it; a request while a push
        of the shard runs is kept for after it (its read may have come before the new commit)."""
        if not self.enabled or shard not in self.ownership.epochs:
            return
        running = self._running.get(shard)
        if running is not None and not running.done():
            self._wanted.add(shard)
            return
        self._running[shard] = asyncio.create_task(self._push_shard(shard), name=f"sql-enqueues-{shard}")

    def tasks(self) -> list[asyncio.Task[None]]:
        """The pushes under way (cancelled on shutdown)."""
        return [t for t in [*self._running.values(), *self._sweeps] if not t.done()]

    async def run(self) -> None:
        """Listen for commits, and sweep: both until cancelled."""
        if not self.enabled:
            return
        await asyncio.gather(self._listen(), self._sweep_every_interval())

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self.store.listen_enqueued(self.soon, self._on_listening)
                log.warning("the LISTEN connection for SQL enqueues ended; listening again")
            except StoreUnavailable as exc:
                log.warning("not listening for SQL enqueues; the sweep pushes them meanwhile", error=str(exc))
            except Exception:
                log.exception("listening for SQL enqueues failed")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, LISTEN_RETRY_MAX_S)

    def _on_listening(self) -> None:
        # Commits made while nobody listened were not heard: look at every owned shard once.
        task = asyncio.create_task(self._sweep_once(), name="sql-enqueues-sweep")
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _sweep_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            await self._sweep_once()

    async def _sweep_once(self) -> None:
        try:
            await self.sweep()
        except StoreUnavailable as exc:
            log.warning("sweep of SQL enqueues failed", error=str(exc))

    async def sweep(self) -> None:
        """Push the noted jobs of every owned shard that has any."""
        for shard in await self.store.shards_to_push():
            self.soon(shard)

    async def _push_shard(self, shard: int) -> None:
        try:
            while True:
                self._wanted.discard(shard)
                while shard in self.ownership.epochs:
                    ids = await self.store.ids_to_push(shard, PUSH_CHUNK)
                    if ids:
                        await self._push(shard, ids)
                    if len(ids) < PUSH_CHUNK:
                        break
                if shard not in self._wanted:
                    return
        except StoreUnavailable as exc:
            log.warning("pushing SQL enqueues failed; the sweep tries again", shard=shard, error=str(exc))
        except Exception:
            log.exception("pushing SQL enqueues failed; the sweep tries again", shard=shard)

    async def _push(self, shard: int, ids: list[str]) -> None:
        async with self.writer.forgets_held(shard, ids):
            rows = [r for r in await self.store.get_jobs(ids) if r.status in ACTIVE]
            if rows:
                now = wall_ms()
                # Pushed or, should Redis or the shard fail it, noted unpushed for the reconciler:
                # either way the note here has done its work.
                await self.ingest.push(
                    shard, [NewJob(r.id, record_from_row(r, now), r.payload) for r in rows]
                )
                metrics.count(metrics.ENQUEUED, ((metrics.type_label(r.type),) for r in rows))
                self.pushed_total += len(rows)
        await self.store.forget_to_push(ids)

"""The enqueue path: commit to the DB (group commit), then push to the shard's Redis queues.

An enqueue is acknowledged once its DB transaction commits: from then on the job is never lost,
and the push of the shards this process owns goes on behind the reply (jobs of another process's
shards are handed to it first, and it queues them behind its answer to the hand-off). Concurrent
enqueues share one transaction, so single-job enqueues from many clients cost one commit per batch
rather than one each. When Redis cannot take the jobs after the commit they are still accepted:
the reconciler pushes them once Redis is back; when this process dies first, the shard's next
owner reconciles them when it acquires the shard.

Queueing behind the reply takes the Redis work off each call's critical path (docs/performance.md
has each step's figures). Meanwhile a job may be committed but not yet queued: Stats answers after
this process's pushes settle, and a cancel that finds no record leaves a note its push honours
(cancel.lua).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from shardmap import shard_for
from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument, NotOwner, StoreUnavailable

from ..config import REQUEST_OVERHEAD_BYTES
from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..ops.tracing import now_ns, spans
from ..store import JobRow, Store
from ..store.dependencies import WAITING, Edge
from . import failpoints
from .ids import new_job_ids
from .ownership import Ownership
from .reconciler import record_from_row
from .records import JobRecord
from .states import JobState
from .validation import DEPENDENCIES_HEADER, ValidJob, headers_json, job_graph
from .working_set import NewJob, WorkingSet

log = structlog.get_logger("shardq.ingest")
PUSH_CHUNK = 1000
# Most jobs in one hand-off (PushJobs) to another process.
MAX_PUSH = 20_000
# Committed jobs whose pushes are still on the way, at most: past it an enqueue's reply waits, so a
# producer faster than Redis is held to Redis's pace and the backlog's memory stays bounded.
MAX_UNQUEUED = 20_000


Committed = tuple[list[tuple[str, bool]], Any]  # (id, created) per row, and what ``committed`` made of them


class GroupCommit:
    """Insert rows from concurrent callers in shared transactions. ``committed`` sees each group's
    rows and results before any of its callers resumes (what it returns goes to each caller), so
    work that should start at the commit is not queued behind the callers' answers."""

    def __init__(
        self,
        store: Store,
        committed: Callable[[list[tuple[Sequence[JobRow], list[tuple[str, bool]]]]], list[Any]] | None = None,
    ) -> None:
        self.store = store
        self.committed = committed or (lambda parts: [None] * len(parts))
        self._queue: asyncio.Queue[tuple[Sequence[JobRow], asyncio.Future[Committed]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def insert(self, rows: Sequence[JobRow]) -> Committed:
        future: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()
        await self._queue.put((rows, future))
        return await future

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and sum(len(r) for r, _ in batch) < 20_000:
                batch.append(self._queue.get_nowait())
            rows = [row for part, _ in batch for row in part]
            try:
                results = await self.store.insert_jobs(rows)
            except StoreUnavailable as exc:
                _fail(batch, exc)
                continue
            except Exception:
                if len(batch) == 1:
                    _fail(batch, InvalidArgument("the database refused the job(s)"))
                    log.exception("insert refused")
                    continue
                # One caller's rows poisoned the shared transaction: give each caller its own.
                for part, future in batch:
                    try:
                        result = await self.store.insert_jobs(part)
                    except StoreUnavailable as exc:
                        _fail([(part, future)], exc)
                    except Exception:
                        log.exception("insert refused")
                        _fail([(part, future)], InvalidArgument("the database refused the job(s)"))
                    else:
                        _release([(part, future)], [result], self.committed)
                continue
            parts, start = [], 0
            for part, _ in batch:
                parts.append(results[start : start + len(part)])
                start += len(part)
            _release(batch, parts, self.committed)


def _release(
    batch: list[tuple[Sequence[JobRow], asyncio.Future[Committed]]],
    results: list[list[tuple[str, bool]]],
    committed: Callable[[list[tuple[Sequence[JobRow], list[tuple[str, bool]]]]], list[Any]],
) -> None:
    made = committed([(part, result) for (part, _), result in zip(batch, results, strict=True)])
    for (_, future), result, extra in zip(batch, results, made, strict=True):
        if not future.done():
            future.set_result((result, extra))


def _fail(batch: list[tuple[Sequence[JobRow], asyncio.Future[Committed]]], exc: Exception) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)


class CoalescedPush:
    """Jobs that concurrent enqueues queue in one shard at the same moment go to Redis in one script
    call: the callers a group commit releases together resume one after another in the same turn of
    the event loop, and the call is made once they all have added their jobs."""

    def __init__(self, push: Callable[[int, list[NewJob]], Awaitable[None]]) -> None:
        self._push = push
        self._gathering: dict[int, list[tuple[list[NewJob], asyncio.Future[None]]]] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def push(self, shard: int, jobs: list[NewJob]) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiting = self._gathering.get(shard)
        if waiting is None:
            waiting = self._gathering[shard] = []
            loop.call_soon(self._send, shard)
        waiting.append((jobs, future))
        await future

    def _send(self, shard: int) -> None:
        task = asyncio.create_task(self._run(shard, self._gathering.pop(shard)))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, shard: int, waiting: list[tuple[list[NewJob], asyncio.Future[None]]]) -> None:
        try:
            await self._push(shard, [job for jobs, _ in waiting for job in jobs])
        except BaseException as exc:
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for _, future in waiting:
                if not future.done():
                    future.set_result(None)


class Ingestor:
    def __init__(
        self,
        shard_count: int,
        store: Store,
        working_set: WorkingSet,
        ownership: Ownership,
        on_pushed: Callable[[int, list[tuple[NewJob, int]]], None],
        on_push_failed: Callable[[int, list[str]], None],
        hand_off: Callable[[int, list[NewJob]], Awaitable[None]],
        max_request_bytes: int = 64 << 20,
    ) -> None:
        self.shard_count = shard_count
        self.working_set = working_set
        self.ownership = ownership
        self.on_pushed = on_pushed  # (shard, [(job, 1 ready | 2 delayed)])
        self.on_push_failed = on_push_failed  # (shard, ids): note them unpushed, reconcile the shard
        self.hand_off = hand_off  # (shard, jobs): the shard is another process's: give them to its owner
        # A hand-off must fit the owner's request limit (the same SHARDQ_MAX_REQUEST_BYTES).
        self.hand_off_bytes = max_request_bytes - REQUEST_OVERHEAD_BYTES
        self.store = store
        self.commit = GroupCommit(store, self._committed)
        self._coalesced = CoalescedPush(self.push)
        self.unqueued = 0  # committed jobs whose pushes have not finished
        self._queueing: set[asyncio.Task[None]] = set()
        self._room = asyncio.Event()
        self._room.set()

    async def enqueue(
        self, jobs: Sequence[ValidJob], now: int, may_use: Callable[[str], bool] = lambda t: True
    ) -> list[tuple[str, bool]]:
        """Commit the jobs, then push them (in the background; another process's, before the answer).
        Jobs with dependencies (issue 21) are committed in a transaction of their own with their
        edges, 'waiting' until their dependencies finish; ``may_use`` says which types' jobs the
        caller may name as dependencies."""
        rows = self._rows(jobs, now)
        start_ns = now_ns() if spans.enabled else 0
        hand_on: dict[int, list[NewJob]] = {}
        if any(j.depends_on or j.blocks for j in jobs):
            results, to_push = await self._commit_graph(jobs, rows, may_use)
            held = bool(to_push)
        else:
            # The group commit queues this process's shards' jobs as it completes (_committed);
            # another process's come back here, to hand on before the answer.
            results, (hand_on, held) = await self.commit.insert(rows)
            to_push = []
        if spans.enabled:
            spans.record(
                "shardq commit",
                start_ns,
                (json.loads(row.headers) if row.headers else None for row in rows),
                {"messaging.batch.message_count": len(rows)},
            )
        created = [row for row, (_, new) in zip(rows, results, strict=True) if new]
        metrics.count(metrics.ENQUEUED, ((metrics.type_label(row.type),) for row in created))
        if to_push:
            await self._push_rows(to_push, before_answer=True)
        # Another process's jobs are handed on before the answer: were this process to die after
        # answering, their owner would not queue them until its next full reconcile (minutes). The
        # owner answers once it has them (take), so only their trip to it is waited for.
        await asyncio.gather(*(self._hand_on(shard, new) for shard, new in hand_on.items()))
        if held:
            await self._backlog_room()
        return results

    async def _commit_graph(
        self, jobs: Sequence[ValidJob], rows: list[JobRow], may_use: Callable[[str], bool]
    ) -> tuple[list[tuple[str, bool]], list[JobRow]]:
        graph = job_graph(list(jobs))
        edges: list[Edge] = []
        field_of: dict[str, str] = {}
        for e in graph:
            target = rows[e.depends_on].id if e.depends_on is not None else e.job_id
            edges.append(Edge(rows[e.job].id, target, e.on_failure))
            rows[e.job].deps_remaining += 1
            if e.depends_on is None:
                k = next(k for k, (name, _) in enumerate(jobs[e.job].depends_on) if name == e.job_id)
                field_of.setdefault(target, f"jobs[{e.job}].depends_on[{k}].job")
        blocks = []
        for i, j in enumerate(jobs):
            for k, (waiting_id, policy) in enumerate(j.blocks):
                blocks.append(Edge(waiting_id, rows[i].id, policy))
                field_of.setdefault(waiting_id, f"jobs[{i}].blocks[{k}].job")
        for row in rows:
            if row.deps_remaining:
                row.status = WAITING
                # Its leases carry its dependencies' results (sessions.py reads the mark).
                headers = json.loads(row.headers) if row.headers else {}
                headers[DEPENDENCIES_HEADER] = "1"
                row.headers = headers_json(headers)
        return await self.store.insert_graph(
            rows, edges, may_use, lambda job_id: field_of.get(job_id, job_id), blocks
        )

    def push_resolved(self, promoted: list[JobRow], cancelled: list[str]) -> None:
        """Jobs a commit moved out of 'waiting' (store.on_resolved): push them behind it. A push
        lost here (this process dies first) is the reconciler's: their rows say ready or delayed."""
        if cancelled:
            metrics.DEPENDENCY_CANCELLED.inc(len(cancelled))
        if promoted:
            metrics.PROMOTED_FROM_WAITING.inc(len(promoted))
            failpoints.hit("workflow.before-push")
            task = asyncio.create_task(self._push_rows(promoted, before_answer=False))
            self._queueing.add(task)
            task.add_done_callback(self._queueing.discard)

    def _rows(self, jobs: Sequence[ValidJob], now: int) -> list[JobRow]:
        shards = {t: shard_for(t, self.shard_count) for t in {j.type for j in jobs}}
        delayed, ready = JobState.DELAYED.value, JobState.READY.value
        # Positional: binding 21 keyword arguments costs several times the row itself.
        rows = [
            JobRow(
                job_id,  # id
                j.type,
                shards[j.type],
                int(j.priority),
                j.payload,
                delayed if j.run_at_ms > now else ready,  # status
                j.run_at_ms,
                None,  # lease_until
                0,  # attempts
                0,  # failures
                0,  # expirations
                j.max_attempts,
                j.lease_ttl_ms,
                j.idempotency_key or None,
                None,  # last_error
                None,  # dead_reason
                None,  # result
                now,  # enqueued_at
                None,  # started_at
                None,  # finished_at
                now,  # updated_at
                None,  # schedule
                j.concurrency_key or None,
                0,  # rate_limited
                j.headers,
            )
            for job_id, j in zip(new_job_ids(len(jobs)), jobs, strict=True)
        ]
        return rows

    async def _push_rows(self, rows: list[JobRow], *, before_answer: bool) -> None:
        """Push committed rows: this process's shards' behind the answer (``before_answer``), the
        others' handed on and awaited; released from 'waiting' (not before an answer), all awaited."""
        by_shard: dict[int, list[NewJob]] = defaultdict(list)
        records: dict[tuple[Any, ...], JobRecord] = {}
        for row in rows:
            by_shard[row.shard].append(_new_job(row, records))
        handed_on = []
        for shard, new in by_shard.items():
            if shard in self.ownership.epochs and before_answer:
                self._queue_behind(shard, new)
            else:
                handed_on.append(self._hand_on(shard, new))
        await asyncio.gather(*handed_on)

    def _committed(
        self, parts: list[tuple[Sequence[JobRow], list[tuple[str, bool]]]]
    ) -> list[tuple[dict[int, list[NewJob]], bool]]:
        """A group commit's new jobs as the group's callers resume: this process's shards' jobs
        queued at once (one push per shard for the whole group, its Redis call on the way before
        the first answer is built), another's per caller, to hand on before its answer."""
        try:
            return self._sort_committed(parts)
        except Exception:
            # A bug, not an outage: the jobs are committed, so the reconciler queues them, and the
            # callers are still answered (the group commit's task must live on).
            log.exception("sorting committed jobs failed; the reconciler will")
            unqueued: dict[int, list[str]] = defaultdict(list)
            for rows, results in parts:
                for row, (_, new) in zip(rows, results, strict=True):
                    if new:
                        unqueued[row.shard].append(row.id)
            for shard, ids in unqueued.items():
                self.on_push_failed(shard, ids)
            return [({}, False) for _ in parts]

    def _sort_committed(
        self, parts: list[tuple[Sequence[JobRow], list[tuple[str, bool]]]]
    ) -> list[tuple[dict[int, list[NewJob]], bool]]:
        owned: dict[int, list[NewJob]] = defaultdict(list)
        per_caller: list[tuple[dict[int, list[NewJob]], int]] = []
        records: dict[tuple[Any, ...], JobRecord] = {}  # jobs alike share one (immutable) record
        for rows, results in parts:
            others: dict[int, list[NewJob]] = defaultdict(list)
            mine = 0  # of this caller's jobs, those queued here
            for row, (_, new) in zip(rows, results, strict=True):
                if not new:
                    continue
                if row.shard in self.ownership.epochs:
                    owned[row.shard].append(_new_job(row, records))
                    mine += 1
                else:
                    others[row.shard].append(_new_job(row, records))
            per_caller.append((others, mine))
        # Counted caller by caller, in the order they committed: the answers of those whose jobs
        # took the backlog past its bound wait for room, as if each had queued its own.
        out = []
        for others, mine in per_caller:
            self._count_unqueued(mine)
            out.append((others, self.unqueued > MAX_UNQUEUED))
        for shard, jobs in owned.items():  # the group is gathered already: no coalescing step
            self._start_queueing(shard, jobs, self.push)
        return out

    async def _hand_on(self, shard: int, jobs: list[NewJob]) -> None:
        """Push or hand on committed jobs before the answer, which is OK whatever fails here: an
        error would make the client send the committed jobs again, and they would run twice."""
        try:
            await self._coalesced.push(shard, jobs)
        except Exception:
            log.exception(
                "handing on committed jobs failed; the reconciler will", shard=shard, jobs=len(jobs)
            )
            self.on_push_failed(shard, [job.id for job in jobs])

    async def take(self, shard: int, jobs: list[NewJob]) -> None:
        """Committed jobs of a shard this process owns, handed over by the process that committed
        them: queued behind the answer like this process's own. Should it die first, the shard's
        next owner queues them when it acquires the shard (reconcile on acquisition)."""
        self._queue_behind(shard, jobs)
        await self._backlog_room()

    async def _backlog_room(self) -> None:
        if self.unqueued > MAX_UNQUEUED:
            await self._room.wait()

    def _queue_behind(self, shard: int, jobs: list[NewJob]) -> None:
        """Jobs handed over by another process: hand-offs that arrive together share a push."""
        self._count_unqueued(len(jobs))
        self._start_queueing(shard, jobs, self._coalesced.push)

    def _count_unqueued(self, count: int) -> None:
        self.unqueued += count
        if self.unqueued > MAX_UNQUEUED:
            self._room.clear()

    def _start_queueing(
        self, shard: int, jobs: list[NewJob], push: Callable[[int, list[NewJob]], Awaitable[None]]
    ) -> None:
        """Push jobs counted in ``unqueued`` (their push uncounts them)."""
        task = asyncio.create_task(self._queue(shard, jobs, push))
        self._queueing.add(task)
        task.add_done_callback(self._queueing.discard)

    async def _queue(
        self, shard: int, jobs: list[NewJob], push: Callable[[int, list[NewJob]], Awaitable[None]]
    ) -> None:
        failpoints.hit("ingest.before-queue")
        try:
            await push(shard, jobs)
        except Exception:
            # Not a Redis outage (push() handles those): the jobs are committed, so the reconciler
            # queues them; say so loudly, it is a bug.
            log.exception("queueing committed jobs failed; the reconciler will", shard=shard, jobs=len(jobs))
            self.on_push_failed(shard, [job.id for job in jobs])
        finally:
            self.unqueued -= len(jobs)
            if self.unqueued <= MAX_UNQUEUED:
                self._room.set()

    async def settle(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until the jobs committed so far are queued or handed on."""
        if self._queueing:
            await asyncio.wait(set(self._queueing), timeout=timeout)

    async def _hand_off_in_parts(self, shard: int, jobs: list[NewJob]) -> None:
        """Hand the jobs to the shard's owner in requests within its size and count limits: the jobs of
        concurrent enqueues are pushed together, and together they can be over both."""
        part: list[NewJob] = []
        size = 0
        for job in jobs:
            job_size = len(job.payload) + len(job.record.pack()) + len(job.id) + 16  # + field framing
            if part and (size + job_size > self.hand_off_bytes or len(part) >= MAX_PUSH):
                await self.hand_off(shard, part)
                part, size = [], 0
            part.append(job)
            size += job_size
        if part:
            await self.hand_off(shard, part)

    async def push(self, shard: int, jobs: list[NewJob]) -> None:
        """Queue committed jobs in the shard's Redis sets, or hand them to the shard's owner."""
        epoch = self.ownership.epochs.get(shard)
        if epoch is None:
            await self._hand_off_in_parts(shard, jobs)
            return
        start = 0  # the jobs before it are in Redis, should a later chunk fail
        try:
            for start in range(0, len(jobs), PUSH_CHUNK):
                chunk = jobs[start : start + PUSH_CHUNK]
                start_ns = now_ns() if spans.enabled else 0
                placed = await self.working_set.enqueue(shard, epoch, wall_ms(), chunk)
                if spans.enabled:
                    spans.record(
                        "shardq push",
                        start_ns,
                        (job.record.headers for job in chunk),
                        {
                            "messaging.destination.partition.id": str(shard),
                            "messaging.batch.message_count": len(chunk),
                        },
                    )
                self.on_pushed(shard, list(zip(chunk, placed, strict=True)))
        except NotOwner:
            if await self.ownership.recover(shard, epoch):
                # Redis lost the shard and this process took it back: the recovery's reconcile
                # restores these jobs from their rows, re-reading each under its forget guard.
                # Pushed again here as well, one could land after the restored copy ran and was
                # forgotten, and run twice.
                self.on_push_failed(shard, [job.id for job in jobs[start:]])
            elif not self.ownership.owns(shard):
                await self._hand_off_in_parts(shard, jobs[start:])  # another process took it over
            else:
                self.on_push_failed(shard, [job.id for job in jobs[start:]])
        except REDIS_ERRORS as exc:
            # Committed, so not lost: the reconciler pushes them once Redis takes writes again.
            note_redis_error("push", exc, shard=shard, jobs=len(jobs) - start)
            self.on_push_failed(shard, [job.id for job in jobs[start:]])


def _new_job(row: JobRow, records: dict[tuple[Any, ...], JobRecord]) -> NewJob:
    """A committed row as the job its push puts in Redis. Jobs alike share one (immutable) record
    in ``records``: packing it once serves them all."""
    kind = (
        row.type, row.priority, row.run_at, row.max_attempts, row.lease_ttl_ms, row.idem_key,
        row.concurrency_key, row.headers, row.enqueued_at,
    )  # fmt: skip
    record = records.get(kind)
    if record is None:
        record = records[kind] = record_from_row(row, row.enqueued_at)
    return NewJob(row.id, record, row.payload)

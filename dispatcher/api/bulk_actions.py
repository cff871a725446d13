"""The bulk actions of BulkJobs: cancel, requeue, run now or delete the jobs a search filter
selects, in bounded batches, each through the path its single-job form takes, so Redis and the DB
agree afterwards as they do after one job's action:

- cancel: ``queue/cancel.py`` ``Canceller.cancel`` for each job (CancelJob's path): a waiting job
  never runs, a running one is told to stop and is not retried;
- requeue: RequeueDead's path (the rows first, then the records restored in Redis);
- run now: ``run_now.lua`` makes the delayed jobs due in one atomic step per batch, then the row's
  run_at follows and the shard's promoter moves them to their ready sets (at once when this process
  owns the shard; within the promoter's idle recheck, 5 s, when another process does);
- delete: finished rows whose records Redis no longer holds (as retention deletes them); a job that
  finished a moment ago keeps its row until its status write is on disk and Redis forgot it.

The filter selects among the jobs the action applies to (its states, intersected with the filter's).
Jobs are taken oldest first by id, ``BATCH`` at a time, at most the call's limit; the next call goes
on after the last id (a job the action could not change, or whose row has not followed Redis yet,
is not taken again).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import structlog

from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

from ..queue.cancel import Canceller
from ..queue.shard_loops import ShardLoops
from ..queue.working_set import WorkingSet
from ..store import JobQuery, JobRow, Store

log = structlog.get_logger("shardq.bulk_actions")
#: Jobs read and acted on at a time.
BATCH = 500
#: Cancels run at once within a batch (each waits for its status write; they share commits).
CANCELS_AT_ONCE = 32
DEFAULT_LIMIT = 10_000
MAX_LIMIT = 100_000
#: The states each action applies to.
APPLIES_TO = {
    pb.BULK_ACTION_CANCEL: ("delayed", "ready", "leased", "waiting"),
    pb.BULK_ACTION_REQUEUE: ("dead",),
    pb.BULK_ACTION_RUN_NOW: ("delayed",),
    pb.BULK_ACTION_DELETE: ("succeeded", "cancelled", "dead"),
}
ACTION_NAMES = {
    pb.BULK_ACTION_CANCEL: "cancel",
    pb.BULK_ACTION_REQUEUE: "requeue",
    pb.BULK_ACTION_RUN_NOW: "run_now",
    pb.BULK_ACTION_DELETE: "delete",
}
Selected = list[tuple[str, int, str, int, str]]  # (id, shard, type, priority, status)


@dataclass(frozen=True)
class BulkOutcome:
    matched: int
    touched: int
    more: bool
    last_id: str


def action(value: int) -> int:
    if value not in APPLIES_TO:
        raise InvalidArgument(f"action: give cancel, requeue, run_now or delete (not {value})")
    return value


def limit(value: int) -> int:
    if value > MAX_LIMIT:
        raise InvalidArgument(f"limit: {value} is over {MAX_LIMIT} jobs a call")
    return value or DEFAULT_LIMIT


def narrowed(query: JobQuery, bulk_action: int) -> JobQuery:
    """The query limited to the states the action applies to."""
    states = APPLIES_TO[bulk_action]
    chosen = tuple(s for s in states if not query.statuses or s in query.statuses)
    return replace(query, statuses=chosen, types=() if not chosen else query.types)


class BulkActions:
    def __init__(
        self,
        store: Store,
        working_set: WorkingSet,
        canceller: Canceller,
        loops: ShardLoops,
        requeue: Callable[[list[JobRow]], Awaitable[int]],
    ) -> None:
        self.store = store
        self.working_set = working_set
        self.canceller = canceller
        self.loops = loops
        self.requeue = requeue  # RequeueDead's path (JobService._requeue)

    async def run(
        self, bulk_action: int, query: JobQuery, max_jobs: int, dry_run: bool, after_id: str = ""
    ) -> BulkOutcome:
        query = narrowed(query, bulk_action)
        matched = touched = 0
        after = after_id
        more = False
        while matched < max_jobs:
            want = min(BATCH, max_jobs - matched)
            selected = await self.store.search_ids(query, want + 1, after)
            more = len(selected) > want
            selected = selected[:want]
            if not selected:
                break
            matched += len(selected)
            after = selected[-1][0]
            if not dry_run:
                touched += await self._apply(bulk_action, selected)
            if not more:
                break
        log.info(
            "bulk action",
            action=ACTION_NAMES[bulk_action],
            matched=matched,
            touched=touched,
            more=more,
            dry_run=dry_run,
        )
        return BulkOutcome(matched, touched, more, after)

    async def _apply(self, bulk_action: int, selected: Selected) -> int:
        if bulk_action == pb.BULK_ACTION_CANCEL:
            return await self._cancel(selected)
        if bulk_action == pb.BULK_ACTION_REQUEUE:
            rows = [r for r in await self.store.get_jobs([s[0] for s in selected]) if r.status == "dead"]
            return await self.requeue(rows) if rows else 0
        by_shard: dict[int, list[str]] = defaultdict(list)
        for job_id, shard, *_ in selected:
            by_shard[shard].append(job_id)
        if bulk_action == pb.BULK_ACTION_RUN_NOW:
            return await self._run_now(by_shard)
        return await self._delete(by_shard)

    async def _cancel(self, selected: Selected) -> int:
        gate = asyncio.Semaphore(CANCELS_AT_ONCE)

        async def cancel(job_id: str, shard: int, job_type: str, priority: int, status: str) -> bool:
            async with gate:
                after = await self.canceller.cancel(job_id, shard, job_type, priority, status)
            return after in ("cancelled", "leased")  # not one that had finished meanwhile

        done = await asyncio.gather(*(cancel(*s) for s in selected))
        return sum(done)

    async def _run_now(self, by_shard: dict[int, list[str]]) -> int:
        n = 0
        for shard, ids in by_shard.items():
            now = wall_ms()
            moved = await self.working_set.run_now(shard, ids, now)
            if moved:
                await self.store.due_now(moved, now)
                self.loops.wake_promoter(shard, now)
                n += len(moved)
        return n

    async def _delete(self, by_shard: dict[int, list[str]]) -> int:
        n = 0
        for shard, ids in by_shard.items():
            gone = await self.working_set.missing(shard, ids)
            n += await self.store.delete_finished_rows([j for j in ids if j in gone])
        return n

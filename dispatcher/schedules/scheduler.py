"""Materializes schedule occurrences into jobs, in each dispatcher, for the shards it owns.

Every tick (SHARDQ_SCHEDULE_TICK_MS): first the schedules changed since the last tick have the
future occurrences of their older versions cancelled; then each schedule with an occurrence due
within the lookahead has its occurrences planned (catch_up.plan_tick) and materialized in ONE DB
transaction that also moves its cursor, compare-and-set on the cursor the tick read. Only then
are the new jobs queued in Redis. So:
- an occurrence's job id is derived from (schedule, version, time) and the DB's primary key and
  the enqueue script's existence check refuse a second copy: two racing ticks (two owners for a
  moment, or two loops) create each occurrence once; the loser's transaction changes nothing;
- a crash before the commit loses nothing (the cursor did not move: the next owner does it);
  a crash after the commit and before Redis leaves committed jobs Redis lacks, which the shard's
  next owner restores when it acquires the shard (the reconciler), like any enqueue.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import replace

import structlog

from shardq_common.clock import wall_ms
from shardq_common.errors import StoreUnavailable
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.wakeup import Wakeup, cancelling

from ..config import Settings
from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..queue import failpoints
from ..queue.cancel import Canceller
from ..queue.ids import occurrence_job_id
from ..queue.ingest import Ingestor
from ..queue.ownership import Ownership
from ..queue.reconciler import record_from_row
from ..queue.states import JobState
from ..queue.working_set import NewJob
from ..store import Advance, JobRow, ScheduleRow, Store
from .catch_up import CatchUp, plan_tick
from .cron import Cron
from .spec import log_change, schedule_spec

log = structlog.get_logger("shardq.scheduler")
TICK_LIMIT = 500  # occurrences one schedule deals with per tick; a long downtime takes several
DUE_BATCH = 200  # schedules one tick reads
#: Parsed (expression, zone) pairs kept, the least recently used dropped first: an application that
#: makes up expressions per schedule would otherwise grow the map for the life of the process.
MAX_PARSED_CRONS = 4096


class Scheduler:
    def __init__(
        self, settings: Settings, store: Store, ownership: Ownership, ingest: Ingestor, canceller: Canceller
    ) -> None:
        self.settings = settings
        self.store = store
        self.ownership = ownership
        self.ingest = ingest
        self.canceller = canceller
        self.wake = Wakeup()
        self._crons: OrderedDict[tuple[str, str], Cron] = OrderedDict()

    async def run(self) -> None:
        while True:
            self.wake.clear()
            behind = False
            try:
                behind = await self.tick()
            except StoreUnavailable as exc:
                if cancelling():
                    raise
                log.warning("schedule tick failed; trying again next tick", error=str(exc))
            except REDIS_ERRORS as exc:
                if cancelling():
                    raise
                note_redis_error("scheduler", exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("schedule tick failed")
            if not behind:
                await self.wake.wait(self.settings.schedule_tick_ms / 1000)

    async def tick(self) -> bool:
        """One pass over the owned shards' schedules. True when some schedule is still behind."""
        shards = sorted(self.ownership.epochs)
        if not shards:
            return False
        for schedule in await self.store.schedules_to_clean(shards):
            await self._clean_up(schedule)
        now = wall_ms()
        due = await self.store.due_schedules(shards, now + self.settings.schedule_lookahead_ms, DUE_BATCH)
        behind = len(due) >= DUE_BATCH
        for schedule in due:
            if schedule.shard in self.ownership.epochs:
                behind |= await self._materialize(schedule, now)
        return behind

    async def declare(self, spec: pb.ScheduleSpec, field: str = "schedule") -> tuple[ScheduleRow, bool, bool]:
        """Validate and store a schedule (Store.upsert_schedule); returns (row, created, changed).
        The owner of its shard applies it at its next tick (at once when that is this process)."""
        wanted, enabled = schedule_spec(spec, self.settings, field)
        if enabled is not False:  # a new schedule's first occurrence, which the owner looks for
            wanted = replace(wanted, next_occurrence_ms=self.cron_of(wanted).first_after(wall_ms()))
        row, created, changed = await self.store.upsert_schedule(wanted, enabled)
        if created or changed:
            self.wake.set()
            log_change(row, "created" if created else "changed")
        return row, created, changed

    def cron_of(self, schedule: ScheduleRow) -> Cron:
        key = (schedule.cron, schedule.timezone)
        cron = self._crons.get(key)
        if cron is None:
            cron = self._crons[key] = Cron(schedule.cron, schedule.timezone)
            if len(self._crons) > MAX_PARSED_CRONS:
                self._crons.popitem(last=False)
        else:
            self._crons.move_to_end(key)
        return cron

    async def _materialize(self, schedule: ScheduleRow, now: int) -> bool:
        cron = self.cron_of(schedule)
        plan = plan_tick(
            cron,
            CatchUp(schedule.catch_up),
            schedule.max_lag_ms,
            schedule.cursor_ms,
            now,
            self.settings.schedule_lookahead_ms,
            self.settings.schedule_misfire_grace_ms,
            TICK_LIMIT,
        )
        rows = [_occurrence_row(schedule, at, now) for at in plan.materialize]
        advance = Advance(
            name=schedule.name,
            version=schedule.version,
            from_cursor=schedule.cursor_ms,
            to_cursor=plan.cursor,
            last_occurrence_ms=plan.materialize[-1] if plan.materialize else None,
            next_occurrence_ms=cron.first_after(plan.cursor),
            skipped=len(plan.skipped),
        )
        failpoints.hit("schedule.before-commit")
        created = await self.store.materialize(advance, rows, schedule.version)
        if created is None:
            log.info("schedule changed or advanced elsewhere; skipping this tick", schedule=schedule.name)
            return False
        label = metrics.type_label(schedule.type)
        if plan.skipped:
            metrics.SCHEDULE_SKIPPED.labels(label).inc(len(plan.skipped))
            log.warning(
                "missed schedule occurrences skipped by the catch-up policy",
                schedule=schedule.name,
                policy=schedule.catch_up,
                skipped=len(plan.skipped),
                first=plan.skipped[0],
                last=plan.skipped[-1],
            )
        if not created:
            return plan.behind
        metrics.SCHEDULE_MATERIALIZED.labels(label).inc(len(created))
        metrics.ENQUEUED.labels(label).inc(len(created))
        failpoints.hit("schedule.after-commit")
        fresh = set(created)
        jobs = [_new_job(r) for r in rows if r.id in fresh]
        await self.ingest.push(schedule.shard, jobs)
        failpoints.hit("schedule.after-push")
        for job in jobs:
            log.debug(
                "occurrence materialized", schedule=schedule.name, job=job.id, run_at=job.record.run_at_ms
            )
        return plan.behind

    async def _clean_up(self, schedule: ScheduleRow) -> None:
        """Cancel the older versions' occurrences due after the change. One that is already running
        cannot be taken back: the new version starts after it, so that occurrence is not run twice."""
        floor = schedule.changed_at
        for job in await self.store.stale_occurrences(schedule):
            running = job.status == "leased"  # only with clocks apart: let it finish
            if running or (
                await self.canceller.cancel(job.id, job.shard, job.type, job.priority, job.status)
                != "cancelled"
            ):
                floor = max(floor, job.run_at)
        enabled = schedule.enabled and not schedule.deleted
        cursor = max(schedule.cursor_ms, floor)
        next_ms = self.cron_of(schedule).first_after(cursor) if enabled else None
        await self.store.finish_cleanup(schedule, floor, next_ms)
        log.info(
            "schedule change applied",
            schedule=schedule.name,
            version=schedule.version,
            enabled=enabled,
            deleted=schedule.deleted,
        )


def _occurrence_row(schedule: ScheduleRow, at: int, now: int) -> JobRow:
    return JobRow(
        id=occurrence_job_id(schedule.name, schedule.version, at),
        type=schedule.type,
        shard=schedule.shard,
        priority=schedule.priority,
        payload=schedule.payload,
        status=str(JobState.DELAYED if at > now else JobState.READY),
        run_at=at,
        lease_until=None,
        attempts=0,
        failures=0,
        expirations=0,
        max_attempts=schedule.max_attempts,
        lease_ttl_ms=schedule.lease_ttl_ms,
        idem_key=None,
        last_error=None,
        dead_reason=None,
        result=None,
        enqueued_at=now,
        started_at=None,
        finished_at=None,
        updated_at=now,
    )


def _new_job(row: JobRow) -> NewJob:
    return NewJob(row.id, record_from_row(row, row.enqueued_at), row.payload)

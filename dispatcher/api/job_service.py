"""JobService: the client API (enqueue, inspect, cancel, stats, dead-letter queue)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import structlog

from shardmap import shard_for
from shardq_common.clock import wall_ms
from shardq_common.errors import DispatcherError, InvalidArgument, NotFound, Unavailable
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc

from .. import PROTOCOL_VERSION, __version__
from ..config import Settings
from ..ops import process_counters
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..queue import job_filter, validation
from ..queue.cancel import Canceller
from ..queue.enqueue_streams import EnqueueStreams
from ..queue.flow import retention
from ..queue.ingest import Ingestor
from ..queue.ownership import Ownership
from ..queue.pruner import STATUSES, prune_older_than
from ..queue.reconciler import record_from_row
from ..queue.records import JobRecord
from ..queue.shard_loops import ShardLoops
from ..queue.states import JobState
from ..queue.status_writer import StatusWriter
from ..queue.watches import WATCH_RECHECK_S, Watches
from ..queue.working_set import NewJob, WorkingSet
from ..store import AttemptRow, DeadFilter, JobQuery, JobRow, Store
from ..store.dependencies import EdgeRow
from . import auth, bulk_actions, enqueue_stream
from .bulk_actions import BulkActions
from .status import rpc

log = structlog.get_logger("shardq.job_service")
_STATUS = {
    "delayed": pb.JOB_STATUS_DELAYED,
    "ready": pb.JOB_STATUS_READY,
    "leased": pb.JOB_STATUS_LEASED,
    "succeeded": pb.JOB_STATUS_SUCCEEDED,
    "dead": pb.JOB_STATUS_DEAD,
    "cancelled": pb.JOB_STATUS_CANCELLED,
    "waiting": pb.JOB_STATUS_WAITING,
}
MAX_LIST = 10_000
#: Rows one PruneJobs call deletes by default and at most (the client calls again for more).
DEFAULT_PRUNE_ROWS = 100_000
MAX_PRUNE_ROWS = 1_000_000
STATS_SETTLE_S = 2.0
#: How soon a watch looks again at a job Redis says finished whose row does not yet.
LAGGING_RECHECK_S = 0.1
_FINAL = frozenset({pb.JOB_STATUS_SUCCEEDED, pb.JOB_STATUS_DEAD, pb.JOB_STATUS_CANCELLED})
# Terminal states whose details (result, error) only the DB row holds.
_OUTCOMES = (JobState.SUCCEEDED, JobState.DEAD)


class JobService(pb_grpc.JobServiceServicer):
    def __init__(
        self,
        settings: Settings,
        store: Store,
        working_set: WorkingSet,
        writer: StatusWriter,
        ingest: Ingestor,
        canceller: Canceller,
        ownership: Ownership,
        loops: ShardLoops,
        watches: Watches,
        enqueue_streams: EnqueueStreams,
        member_id: str = "",
    ) -> None:
        self.watches = watches  # the WatchJob streams open in this process
        self.enqueue_streams = enqueue_streams  # the EnqueueStream calls open in this process
        self.member_id = member_id  # named in Stats, whose counters are this process's
        self.settings = settings
        self.store = store
        self.working_set = working_set
        self.writer = writer
        self.ingest = ingest
        self.canceller = canceller
        self.ownership = ownership  # the epoch of a shard a requeue writes to
        self.loops = loops  # a requeued job's promoter, when this process owns its shard
        self.bulk = BulkActions(store, working_set, canceller, loops, self._requeue)

    @rpc
    async def Enqueue(self, request: pb.EnqueueRequest, context: Any) -> pb.EnqueueResponse:
        job_id, created = await self._enqueue_one(request.job)
        return pb.EnqueueResponse(job_id=job_id, created=created)

    async def EnqueueStream(
        self, requests: AsyncIterator[pb.EnqueueStreamRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.EnqueueStreamResponse]:
        try:
            async for message in enqueue_stream.answer(requests, self._enqueue_one, self.enqueue_streams):
                yield message
        except DispatcherError as exc:  # the stream refused (too many open): each job's own go in answers
            await context.abort(exc.code, str(exc))

    async def _enqueue_one(self, spec: pb.JobSpec) -> tuple[str, bool]:
        now = wall_ms()
        job = validation.job_spec(spec, "job", self.settings, now)
        auth.check_types([job.type], "job.type")
        [(job_id, created)] = await self.ingest.enqueue([job], now, auth.may_use)
        return job_id, created

    @rpc
    async def EnqueueMany(self, request: pb.EnqueueManyRequest, context: Any) -> pb.EnqueueManyResponse:
        validation.batch_size(len(request.jobs), self.settings)
        now = wall_ms()
        jobs = [
            validation.job_spec(spec, f"jobs[{i}]", self.settings, now) for i, spec in enumerate(request.jobs)
        ]
        if not all(map(auth.may_use, {job.type for job in jobs})):  # then name the first job refused
            for i, job in enumerate(jobs):
                auth.check_types([job.type], f"jobs[{i}].type")
        if any(job.ref for job in jobs):  # refs unique even where nothing names them
            validation.job_graph(jobs)
        results = await self.ingest.enqueue(jobs, now, auth.may_use)
        return pb.EnqueueManyResponse(job_ids=[r[0] for r in results], created=[r[1] for r in results])

    @rpc
    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        job_id = validation.job_id(request.job_id)
        message, _, row = await self._read_job(job_id)
        runs = [attempt_message(a) for a in await self.store.get_attempts(job_id)]
        latest = _latest_run(row, message)
        if latest is not None and all(r.attempt != latest.attempt for r in runs):
            runs.append(latest)  # it succeeded or goes on: only the job's row holds it
        message.attempt_history.extend(runs)
        deps, dependents, remaining = await self.store.job_graph(job_id)
        message.dependencies.extend(_edge_message(e) for e in deps if not e.type or auth.may_use(e.type))
        message.dependents.extend(_edge_message(e) for e in dependents if not e.type or auth.may_use(e.type))
        message.dependencies_remaining = remaining
        return message

    async def WatchJob(
        self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.JobEvent]:
        """The job now, then at each change (status, counters, progress) until it finishes. Read as
        GetJob reads it, when this process records news of it (a transition or a progress report
        here: it owns the job's shard) and every WATCH_RECHECK_S otherwise (another process owns
        it): so the final event carries the committed outcome, wherever the job ran."""
        try:
            job_id = validation.job_id(request.job_id, "job_id")
            with self.watches.open(job_id) as watch:
                shown: tuple[Any, ...] | None = None
                while True:
                    # Without a flush first: a watched job's lease must not force out every deferred
                    # status write of the process. Its end is flushed (the outcome is in the row).
                    job, lagging, _ = await self._read_job(job_id, flush_first=False)
                    if lagging:  # finished in Redis, its outcome not in the DB yet: in a moment
                        await watch.wait(LAGGING_RECHECK_S)
                        continue
                    final = job.status in _FINAL
                    if watch.progress is not None and not final:
                        job.progress = watch.progress  # this process heard it; the DB has it within a second
                    job.ClearField("payload")
                    seen = (
                        job.status, job.progress, job.attempts, job.failures, job.expirations,
                        job.rate_limited, job.run_at_ms, job.started_at_ms,
                    )  # fmt: skip
                    if seen != shown or final:
                        yield pb.JobEvent(job=job, final=final)
                        shown = seen
                    if final:
                        return
                    await watch.wait(WATCH_RECHECK_S)
                    if self.watches.closing:
                        raise Unavailable("dispatcher is shutting down; watch again")
        except DispatcherError as exc:
            await context.abort(exc.code, str(exc))
        except REDIS_ERRORS as exc:
            note_redis_error("rpc", exc, method="WatchJob")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {exc}")

    async def _job_now(self, job_id: str) -> pb.Job:
        """The job as GetJob reports it, without its attempts: its row, with Redis's live state."""
        return (await self._read_job(job_id))[0]

    async def _read_job(self, job_id: str, *, flush_first: bool = True) -> tuple[pb.Job, bool, JobRow]:
        """The job (see _job_now), and whether Redis says it finished while its committed row does
        not say so yet (the row is reported then)."""
        lagging = False
        row = await (self._committed_row(job_id) if flush_first else self.store.get_job(job_id))
        if row is None:
            raise NotFound(f"no job {job_id}")
        # A scoped caller reads its own types' jobs (a producer, those it may enqueue); another's
        # job is answered as missing, so that its type is not told.
        if not auth.may_use(row.type):
            raise NotFound(f"no job {job_id}")
        # Redis holds the live state; the row may lag it by the write-behind interval.
        record = await self.working_set.record(row.shard, job_id)
        if record is not None and record.state in _OUTCOMES and row.status != record.state:
            # It finished after the row was read. Its outcome (result, error) is only in the DB:
            # read the row again, and until that write is committed (by whichever process owns
            # the shard) report the row as it is, never a success without its result.
            row = await self._committed_row(job_id) or row
            lagging = row.status != record.state
            record = None
        message = job_message(row)
        if record is not None:
            overlay_live_state(message, record)
        return message, lagging, row

    async def _committed_row(self, job_id: str) -> JobRow | None:
        """The job's row, after this process's pending status writes for it are committed."""
        if self.writer.is_pending(job_id):
            await self.writer.flush()
        return await self.store.get_job(job_id)

    @rpc
    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.CancelJobResponse:
        job_id = validation.job_id(request.job_id)
        row = await self.store.get_job(job_id)
        if row is None:
            raise NotFound(f"no job {job_id}")
        auth.check_types([row.type], "job_id")
        status = await self.canceller.cancel(job_id, row.shard, row.type, row.priority, row.status)
        return pb.CancelJobResponse(status=_STATUS[status])

    @rpc
    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        reply = self._process_counters()
        if request.counters_only:
            return reply
        queues: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # Jobs this process acknowledged are counted once queued (another process's, within moments).
        await self.ingest.settle(STATS_SETTLE_S)
        counts = await self.working_set.counts(range(self.settings.shard_count))
        for (job_type, prio, state), n in counts.items():
            queues[(job_type, prio)][state] += n
        for (job_type, prio), n in (await self.store.dead_counts()).items():
            queues[(job_type, prio)]["dead"] += n
        now = wall_ms()
        out = []
        for (job_type, prio), c in sorted(queues.items()):
            if not auth.may_use(job_type):  # a scoped producer sees its own queues only
                continue
            oldest = 0
            if c["ready"]:
                ready_at = await self.working_set.oldest_ready(
                    shard_for(job_type, self.settings.shard_count), job_type, prio
                )
                oldest = max(0, now - ready_at) if ready_at else 0
            out.append(
                pb.QueueStats(
                    type=job_type,
                    priority=validation.priority_to_pb(prio),
                    delayed=c["delayed"],
                    ready=c["ready"],
                    leased=c["leased"],
                    dead=c["dead"],
                    oldest_ready_age_ms=oldest,
                )
            )
        schedules = [
            pb.ScheduleStats(
                name=r.name,
                type=r.type,
                materialized=r.materialized,
                skipped=r.skipped,
                next_occurrence_ms=(r.next_occurrence_ms or 0) if r.enabled else 0,
            )
            for r in await self.store.list_schedules()
            if auth.may_use(r.type)  # a scoped caller sees its own types' schedules only
        ]
        reply.queues.extend(out)
        reply.schedules.extend(schedules)
        return reply

    def _process_counters(self) -> pb.StatsResponse:
        counters = [
            pb.TypeCounters(type=job_type, **fields)
            for job_type, fields in sorted(process_counters.type_counters().items())
            if auth.may_use(job_type)
        ]
        bounds, counts = process_counters.latency_histogram()
        return pb.StatsResponse(
            dispatcher_id=self.member_id,
            sampled_at_ms=wall_ms(),
            started_at_ms=process_counters.STARTED_AT_MS,
            counters=counters,
            enqueue_to_start=pb.LatencyHistogram(bounds_s=bounds, counts=counts),
        )

    @rpc
    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Any) -> pb.WhoAmIResponse:
        principal = auth.current()
        if principal is None:
            return pb.WhoAmIResponse(name="anonymous", role=str(auth.ADMIN), auth=False)
        return pb.WhoAmIResponse(
            name=principal.name, role=str(principal.role), types=principal.types, auth=True
        )

    @rpc
    async def ListDead(self, request: pb.ListDeadRequest, context: Any) -> pb.ListDeadResponse:
        where = self._filter(request.filter)
        limit = request.limit or 100
        if limit > MAX_LIST:
            raise InvalidArgument(f"limit: at most {MAX_LIST}")
        if request.after_id:
            validation.job_id(request.after_id, "after_id")
        await self.writer.flush()
        if where.type:
            auth.check_types([where.type], "filter.type")
        elif auth.scoped():
            # A scoped viewer sees its own types' dead jobs only: chosen in the query, so that a page
            # is full while more are left (dropped after the LIMIT, pages came out short or empty).
            where = replace(where, types=tuple(t for t in await self.store.job_types() if auth.may_use(t)))
        rows = await self.store.list_dead(where, limit, request.after_id)
        return pb.ListDeadResponse(jobs=[job_message(r) for r in rows if auth.may_use(r.type)])

    @rpc
    async def RequeueDead(self, request: pb.RequeueDeadRequest, context: Any) -> pb.RequeueDeadResponse:
        if request.all == bool(request.job_ids):
            raise InvalidArgument("give job_ids or all=true, not both and not neither")
        ids = [validation.job_id(j, f"job_ids[{i}]") for i, j in enumerate(request.job_ids)]
        if len(ids) > MAX_LIST:
            raise InvalidArgument(f"job_ids: at most {MAX_LIST}")
        where = self._filter(request.filter)
        await self.writer.flush()
        requeued = 0
        after = ""
        while True:
            if ids:
                rows = [r for r in await self.store.get_jobs(ids) if r.status == "dead"]
            else:
                rows = await self.store.list_dead(where, 1000, after)
            if not rows:
                break
            requeued += await self._requeue(rows)
            if ids:
                break
            after = rows[-1].id
        return pb.RequeueDeadResponse(requeued=requeued)

    async def _requeue(self, rows: list[JobRow]) -> int:
        now = wall_ms()
        by_shard: dict[int, list[JobRow]] = defaultdict(list)
        for r in rows:
            by_shard[r.shard].append(r)
        n = 0
        for shard, group in by_shard.items():
            # The row first: once the job runs again its status updates must find it active. Only
            # the rows requeued go to Redis: one that retention deleted since it was read is gone.
            requeued = await self.store.requeue_dead([r.id for r in group], now)
            jobs = [
                NewJob(r.id, record_from_row(r, now, requeue=True), r.payload)
                for r in group
                if r.id in requeued
            ]
            if not jobs:
                continue
            epoch = await self.ownership.current_epoch(shard)
            n += (await self.working_set.restore(shard, epoch, "requeue", jobs)).total
            self.loops.wake_promoter(shard, now)
        return n

    @rpc
    async def PurgeDead(self, request: pb.PurgeDeadRequest, context: Any) -> pb.PurgeDeadResponse:
        where = self._filter(request.filter)
        await self.writer.flush()
        return pb.PurgeDeadResponse(purged=await self.store.purge_dead(where))

    @rpc
    async def PruneJobs(self, request: pb.PruneJobsRequest, context: Any) -> pb.PruneJobsResponse:
        older_than_s = retention(request.older_than_s, "older_than_s")
        job_type = validation.job_type(request.type, "type") if request.type else None
        if len(request.statuses) > len(STATUSES):
            raise InvalidArgument(f"statuses: at most {len(STATUSES)}")
        for i, status in enumerate(request.statuses):
            if status not in STATUSES:
                raise InvalidArgument(
                    f"statuses[{i}]: {status[:40]!r} is not a finished status ({', '.join(STATUSES)})"
                )
        if request.limit > MAX_PRUNE_ROWS:
            raise InvalidArgument(f"limit: {request.limit} is over {MAX_PRUNE_ROWS} rows a call")
        rows, more = await prune_older_than(
            self.store,
            self.working_set,
            self.settings.retention,
            self.settings.shard_count,
            older_than_s,
            None if job_type is None else [job_type],
            [s for s in STATUSES if s in request.statuses] or STATUSES,
            dry_run=request.dry_run,
            max_rows=request.limit or DEFAULT_PRUNE_ROWS,
        )
        log.info("jobs pruned", rows=rows, more=more, dry_run=request.dry_run, type=job_type or "*")
        return pb.PruneJobsResponse(rows=rows, more=more)

    @rpc
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        search = job_filter.parse(request.filter)
        limit = job_filter.page_size(request.limit)
        payload_bytes = job_filter.payload_bytes(request.max_payload_bytes)
        newest_first = not request.oldest_first
        digest = search.digest(newest_first)
        after = job_filter.decode_cursor(request.cursor, digest, newest_first) if request.cursor else ""
        query = await self._resolve(search)
        # No flush of the status writer first (a dashboard polling would make it commit early, on
        # the hot path): the rows lag Redis by SHARDQ_FLUSH_INTERVAL_MS at most, and Redis's state
        # is overlaid below.
        rows = await self.store.search_jobs(query, limit + 1, after, newest_first=newest_first)
        more = len(rows) > limit
        last = rows[limit - 1] if more else None  # the cursor's position, before the scope's cut
        rows = [r for r in rows[:limit] if auth.may_use(r.type)]
        records = await self.working_set.records([(r.shard, r.id) for r in rows])
        jobs = []
        for row in rows:
            message = job_message(row)
            record = records.get(row.id)
            # A record that finished after the row was read has its outcome in the DB only: the row
            # is shown as it is until that write commits (as GetJob does).
            if record is not None and not (record.state in _OUTCOMES and row.status != record.state):
                overlay_live_state(message, record)
            _cut(message, payload_bytes)
            jobs.append(message)
        reply = pb.ListJobsResponse(jobs=jobs)
        if last is not None:
            position = (last.finished_at or 0, last.id) if query.in_finished_order else last.id
            reply.next_cursor = job_filter.encode_cursor(position, digest, newest_first)
        if request.with_total:
            reply.total, reply.total_exact = await self.store.count_jobs(query)
        return reply

    @rpc
    async def BulkJobs(self, request: pb.BulkJobsRequest, context: Any) -> pb.BulkJobsResponse:
        action = bulk_actions.action(request.action)
        max_jobs = bulk_actions.limit(request.limit)
        after_id = validation.job_id(request.after_id, "after_id") if request.after_id else ""
        query = await self._resolve(job_filter.parse(request.filter))
        await self.writer.flush()  # the rows read are as this process's transitions left them
        outcome = await self.bulk.run(action, query, max_jobs, request.dry_run, after_id)
        return pb.BulkJobsResponse(
            matched=outcome.matched, touched=outcome.touched, more=outcome.more, last_id=outcome.last_id
        )

    async def _resolve(self, search: job_filter.SearchFilter) -> JobQuery:
        """The filter's types made exact (patterns, scope); the DB's types are read only if needed."""
        scoped = auth.scoped()
        known = await self.store.job_types() if search.needs_known_types(scoped) else []
        return search.resolve(known, auth.may_use, scoped)

    @rpc
    async def GetVersion(self, request: pb.GetVersionRequest, context: Any) -> pb.GetVersionResponse:
        return pb.GetVersionResponse(
            version=__version__, protocol=PROTOCOL_VERSION, shard_count=self.settings.shard_count
        )

    def _filter(self, f: pb.DeadFilter) -> DeadFilter:
        job_type = validation.job_type(f.type, "filter.type") if f.type else ""
        return DeadFilter(job_type, validation.dead_reason(f.reason, "filter.reason"))


def overlay_live_state(message: pb.Job, record: JobRecord) -> None:
    """Redis holds the live state; the row may lag it by the write-behind interval."""
    message.status = _STATUS[str(record.state)]
    message.attempts, message.failures = record.attempts, record.failures
    message.expirations = record.expirations
    message.rate_limited = max(message.rate_limited, record.rate_limited)
    message.lease_until_ms = record.deadline_ms if record.state is JobState.LEASED else 0
    if record.state in (JobState.DELAYED, JobState.READY):
        message.run_at_ms = record.run_at_ms


#: Characters of last_error a listed job keeps (its end: a traceback's last line says most).
LISTED_ERROR_CHARS = 2000


def _cut(message: pb.Job, payload_bytes: int) -> None:
    """A listed job's large fields, cut to size (GetJob returns them whole)."""
    if len(message.payload) > payload_bytes:
        message.payload = message.payload[:payload_bytes]
        message.truncated = True
    if len(message.result) > payload_bytes:
        message.result = message.result[:payload_bytes]
        message.truncated = True
    if len(message.last_error) > LISTED_ERROR_CHARS:
        message.last_error = message.last_error[-LISTED_ERROR_CHARS:]
        message.truncated = True


def _edge_message(e: EdgeRow) -> pb.DependencyEdge:
    return pb.DependencyEdge(
        job_id=e.job_id,
        type=e.type,
        status=_STATUS.get(e.status, pb.JOB_STATUS_UNSPECIFIED),
        on_failure=validation.POLICY_TO_PB.get(e.on_failure, pb.DEPENDENCY_POLICY_FAIL),
        resolved_state=e.resolved_state,
    )


def job_message(row: JobRow) -> pb.Job:
    reason = validation.REASON_TO_PB.get(row.dead_reason, 0) if row.dead_reason else 0  # type: ignore[call-overload]
    return pb.Job(
        id=row.id,
        type=row.type,
        priority=validation.priority_to_pb(row.priority),
        status=_STATUS[row.status],
        payload=row.payload,
        run_at_ms=row.run_at,
        lease_until_ms=row.lease_until or 0,
        attempts=row.attempts,
        failures=row.failures,
        expirations=row.expirations,
        max_attempts=row.max_attempts,
        last_error=row.last_error or "",
        dead_reason=reason,
        idempotency_key=row.idem_key or "",
        enqueued_at_ms=row.enqueued_at,
        started_at_ms=row.started_at or 0,
        finished_at_ms=row.finished_at or 0,
        result=row.result or b"",
        shard=row.shard,
        schedule=row.schedule or "",
        concurrency_key=row.concurrency_key or "",
        rate_limited=row.rate_limited,
        headers=validation.visible_headers(json.loads(row.headers)) if row.headers else None,
        progress=row.progress or "",
        worker_id=row.worker or "",
    )


_OUTCOMES_PB = {
    "succeeded": pb.ATTEMPT_OUTCOME_SUCCEEDED,
    "failed": pb.ATTEMPT_OUTCOME_FAILED,
    "lease_expired": pb.ATTEMPT_OUTCOME_LEASE_EXPIRED,
    "cancelled": pb.ATTEMPT_OUTCOME_CANCELLED,
    "rate_limited": pb.ATTEMPT_OUTCOME_RATE_LIMITED,
}


def _latest_run(row: JobRow, job: pb.Job) -> pb.Attempt | None:
    """The job's latest run as its row tells it (worker, start, end), while it runs or once it
    succeeded (a run that ends otherwise has a row of its own). None when the row does not have it
    yet: Redis is on a later run than the row (its lease's update is on its way)."""
    run = row.attempts + row.rate_limited
    if row.status not in ("leased", "succeeded") or not run or not row.started_at:
        return None
    if job.attempts + job.rate_limited != run:
        return None
    succeeded = job.status == pb.JOB_STATUS_SUCCEEDED
    return pb.Attempt(
        attempt=run,
        worker_id=row.worker or "",
        started_at_ms=row.started_at,
        finished_at_ms=row.finished_at or 0 if succeeded else 0,
        outcome=pb.ATTEMPT_OUTCOME_SUCCEEDED if succeeded else pb.ATTEMPT_OUTCOME_UNSPECIFIED,
    )


def attempt_message(a: AttemptRow) -> pb.Attempt:
    return pb.Attempt(
        attempt=a.attempt,
        worker_id=a.worker or "",
        started_at_ms=a.started_at or 0,
        finished_at_ms=a.finished_at or 0,
        outcome=_OUTCOMES_PB.get(a.outcome or "", pb.ATTEMPT_OUTCOME_UNSPECIFIED),
        error=a.error or "",
        traceback=a.traceback or "",
    )

"""Every call the clients make, described once: the RPC, its request built from the arguments, and
how the reply becomes the typed result. ``Client`` sends these blocking and ``AsyncClient`` awaited,
so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shardq_common.pb import shardq_pb2 as pb

from . import _tracing
from ._convert import (
    STATUS_NAMES,
    Identity,
    JobInfo,
    QueueStats,
    RebalancePlan,
    ShardMap,
    StatsSnapshot,
    VersionInfo,
    WorkerInfo,
    dead_filter,
    job_spec,
)
from ._queues import QueueInfo, QueueSettings, pause_request, settings_request
from ._schedules import Schedule, ScheduleInfo, schedule_from
from ._search import BulkResult, JobFilter, JobPage, bulk_request, list_request

T = TypeVar("T")

JOBS = "JobService"
SHARDS = "ShardService"
SCHEDULES = "ScheduleService"
QUEUES = "QueueService"
WORKERS = "WorkerService"


@dataclass(frozen=True)
class Call(Generic[T]):
    service: str
    method: str
    request: Any
    result: Callable[[Any], T]
    #: The job types an enqueue carries: a client with ``route=True`` sends it to their shards' owner.
    job_types: tuple[str, ...] | None = None


def specs(jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[pb.JobSpec]:
    out = []
    for job in jobs:
        if isinstance(job, pb.JobSpec):
            if _tracing.ENABLED:  # the trace context goes into a copy: the caller may send it again
                copied = pb.JobSpec()
                copied.CopyFrom(job)
                job = copied
            out.append(job)
        else:
            fields = dict(job)
            out.append(job_spec(fields.pop("type"), fields.pop("payload", None), **fields))
    return out


def enqueue(spec: pb.JobSpec) -> Call[str]:
    return Call(JOBS, "Enqueue", pb.EnqueueRequest(job=spec), _job_id, job_types=(spec.type,))


def enqueue_many(specs: list[pb.JobSpec]) -> Call[list[str]]:
    job_types = tuple(s.type for s in specs)
    return Call(JOBS, "EnqueueMany", pb.EnqueueManyRequest(jobs=specs), _job_ids, job_types=job_types)


def get_job(job_id: str) -> Call[JobInfo]:
    return Call(JOBS, "GetJob", pb.GetJobRequest(job_id=job_id), JobInfo.from_pb)


def cancel(job_id: str) -> Call[str]:
    return Call(JOBS, "CancelJob", pb.CancelJobRequest(job_id=job_id), _status_name)


def stats() -> Call[list[QueueStats]]:
    return Call(JOBS, "Stats", pb.StatsRequest(), _queue_stats)


def stats_snapshot(counters_only: bool) -> Call[StatsSnapshot]:
    return Call(JOBS, "Stats", pb.StatsRequest(counters_only=counters_only), StatsSnapshot.from_pb)


def whoami() -> Call[Identity]:
    return Call(JOBS, "WhoAmI", pb.WhoAmIRequest(), Identity.from_pb)


def workers() -> Call[list[WorkerInfo]]:
    return Call(WORKERS, "ListWorkers", pb.ListWorkersRequest(), _workers)


def dead_letters(job_type: str | None, reason: str | None, limit: int, after_id: str) -> Call[list[JobInfo]]:
    request = pb.ListDeadRequest(filter=dead_filter(job_type, reason), limit=limit, after_id=after_id)
    return Call(JOBS, "ListDead", request, _jobs)


def requeue_dead(job_ids: Iterable[str], all: bool, job_type: str | None, reason: str | None) -> Call[int]:
    request = pb.RequeueDeadRequest(job_ids=list(job_ids), all=all, filter=dead_filter(job_type, reason))
    return Call(JOBS, "RequeueDead", request, _requeued)


def purge_dead(job_type: str | None, reason: str | None) -> Call[int]:
    return Call(JOBS, "PurgeDead", pb.PurgeDeadRequest(filter=dead_filter(job_type, reason)), _purged)


def prune_jobs(
    older_than_s: int, job_type: str | None, statuses: Sequence[str], dry_run: bool, limit: int
) -> Call[tuple[int, bool]]:
    request = pb.PruneJobsRequest(
        older_than_s=older_than_s, type=job_type or "", statuses=list(statuses), dry_run=dry_run, limit=limit
    )
    return Call(JOBS, "PruneJobs", request, _pruned)


def list_jobs(
    job_filter: JobFilter | None,
    limit: int,
    cursor: str,
    oldest_first: bool,
    max_payload_bytes: int,
    with_total: bool,
) -> Call[JobPage]:
    request = list_request(job_filter, limit, cursor, oldest_first, max_payload_bytes, with_total)
    return Call(JOBS, "ListJobs", request, lambda reply: JobPage.from_pb(reply, with_total))


def bulk_jobs(
    action: str, job_filter: JobFilter | None, dry_run: bool, limit: int, after_id: str
) -> Call[BulkResult]:
    request = bulk_request(action, job_filter, dry_run, limit, after_id)
    return Call(JOBS, "BulkJobs", request, BulkResult.from_pb)


def version() -> Call[VersionInfo]:
    return Call(JOBS, "GetVersion", pb.GetVersionRequest(), VersionInfo.from_pb)


def shard_map() -> Call[ShardMap]:
    return Call(SHARDS, "GetShardMap", pb.GetShardMapRequest(), ShardMap.from_pb)


def rebalance(dry_run: bool) -> Call[RebalancePlan]:
    return Call(SHARDS, "Rebalance", pb.RebalanceRequest(dry_run=dry_run), RebalancePlan.from_pb)


def upsert_schedule(schedule: Schedule | None, fields: dict[str, Any]) -> Call[tuple[ScheduleInfo, bool]]:
    request = pb.UpsertScheduleRequest(schedule=schedule_from(schedule, fields))
    return Call(SCHEDULES, "UpsertSchedule", request, _upserted)


def get_schedule(name: str) -> Call[ScheduleInfo]:
    return Call(SCHEDULES, "GetSchedule", pb.GetScheduleRequest(name=name), ScheduleInfo.from_pb)


def schedules(job_type: str) -> Call[list[ScheduleInfo]]:
    return Call(SCHEDULES, "ListSchedules", pb.ListSchedulesRequest(type=job_type), _schedules)


def pause_schedule(name: str) -> Call[ScheduleInfo]:
    return Call(SCHEDULES, "PauseSchedule", pb.ScheduleNameRequest(name=name), ScheduleInfo.from_pb)


def resume_schedule(name: str) -> Call[ScheduleInfo]:
    return Call(SCHEDULES, "ResumeSchedule", pb.ScheduleNameRequest(name=name), ScheduleInfo.from_pb)


def delete_schedule(name: str) -> Call[None]:
    return Call(SCHEDULES, "DeleteSchedule", pb.ScheduleNameRequest(name=name), _nothing)


def next_occurrences(name: str, count: int) -> Call[tuple[list[int], str]]:
    request = pb.NextOccurrencesRequest(name=name, count=count)
    return Call(SCHEDULES, "NextOccurrences", request, _occurrences)


def set_queue_settings(
    job_type: str, settings: QueueSettings | None, changes: Mapping[str, Any]
) -> Call[QueueInfo]:
    request = settings_request(job_type, settings, changes)
    return Call(QUEUES, "SetQueueSettings", request, QueueInfo.from_pb)


def get_queue(job_type: str) -> Call[QueueInfo]:
    return Call(QUEUES, "GetQueue", pb.GetQueueRequest(type=job_type), QueueInfo.from_pb)


def list_queues() -> Call[list[QueueInfo]]:
    return Call(QUEUES, "ListQueues", pb.ListQueuesRequest(), _queues)


def pause_queue(job_type: str, priority: str | None) -> Call[QueueInfo]:
    return Call(QUEUES, "PauseQueue", pause_request(job_type, priority), QueueInfo.from_pb)


def resume_queue(job_type: str, priority: str | None) -> Call[QueueInfo]:
    return Call(QUEUES, "ResumeQueue", pause_request(job_type, priority), QueueInfo.from_pb)


def _queues(reply: pb.ListQueuesResponse) -> list[QueueInfo]:
    return [QueueInfo.from_pb(q) for q in reply.queues]


def _job_id(reply: pb.EnqueueResponse) -> str:
    return str(reply.job_id)


def _job_ids(reply: pb.EnqueueManyResponse) -> list[str]:
    return list(reply.job_ids)


def _status_name(reply: pb.CancelJobResponse) -> str:
    return STATUS_NAMES[reply.status]


def _queue_stats(reply: pb.StatsResponse) -> list[QueueStats]:
    return [QueueStats.from_pb(q) for q in reply.queues]


def _workers(reply: pb.ListWorkersResponse) -> list[WorkerInfo]:
    return [WorkerInfo.from_pb(w, reply.dispatcher_id) for w in reply.workers]


def _jobs(reply: pb.ListDeadResponse) -> list[JobInfo]:
    return [JobInfo.from_pb(j) for j in reply.jobs]


def _requeued(reply: pb.RequeueDeadResponse) -> int:
    return int(reply.requeued)


def _purged(reply: pb.PurgeDeadResponse) -> int:
    return int(reply.purged)


def _pruned(reply: pb.PruneJobsResponse) -> tuple[int, bool]:
    return int(reply.rows), bool(reply.more)


def _upserted(reply: pb.UpsertScheduleResponse) -> tuple[ScheduleInfo, bool]:
    return ScheduleInfo.from_pb(reply.schedule), bool(reply.created or reply.changed)


def _schedules(reply: pb.ListSchedulesResponse) -> list[ScheduleInfo]:
    return [ScheduleInfo.from_pb(s) for s in reply.schedules]


def _nothing(reply: pb.DeleteScheduleResponse) -> None:
    return None


def _occurrences(reply: pb.NextOccurrencesResponse) -> tuple[list[int], str]:
    return list(reply.occurrences_ms), reply.timezone

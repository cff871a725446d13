"""ShardService: the shard map, live rebalancing, and hand-offs of new jobs between members."""

from __future__ import annotations

from typing import Any

import structlog

from shardmap import balanced_plan, diff, shard_for
from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument, NotOwner, Unavailable
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc

from ..cluster.coordinator import Coordinator
from ..config import Settings
from ..queue import flow, validation
from ..queue.ingest import MAX_PUSH, Ingestor
from ..queue.keys import ASSIGNMENT_KEY
from ..queue.ownership import Ownership
from ..queue.records import JobRecord
from ..queue.states import JobState
from ..queue.working_set import NewJob, WorkingSet
from .status import rpc

log = structlog.get_logger("shardq.shard_service")


class ShardService(pb_grpc.ShardServiceServicer):
    def __init__(
        self,
        settings: Settings,
        redis: Any,
        coordinator: Coordinator,
        working_set: WorkingSet,
        ownership: Ownership,
        ingest: Ingestor,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.coordinator = coordinator
        self.working_set = working_set
        self.ownership = ownership
        self.ingest = ingest

    @rpc
    async def GetShardMap(self, request: pb.GetShardMapRequest, context: Any) -> pb.GetShardMapResponse:
        view = await self.coordinator.refresh()
        shard_count = self.settings.shard_count
        pending = await self.working_set.shard_counts(list(range(shard_count)))
        shards = []
        for shard in range(shard_count):
            owner, epoch, _ = view.owners.get(shard, ("", 0, 0))
            shards.append(
                pb.ShardInfo(
                    shard=shard,
                    owner=owner,
                    epoch=epoch,
                    address=view.members.get(owner, "") if owner else "",
                    pending=pending.get(shard, 0),
                    assigned=self.coordinator.desired_owner(shard) or "",
                )
            )
        members = [pb.Member(id=m, address=a, alive=m in view.members) for m, a in sorted(view.known.items())]
        return pb.GetShardMapResponse(shard_count=shard_count, members=members, shards=shards)

    @rpc
    async def Rebalance(self, request: pb.RebalanceRequest, context: Any) -> pb.RebalanceResponse:
        coordinator = self.coordinator
        view = await coordinator.refresh()
        members = sorted(view.members)
        if not members:
            raise Unavailable("no live dispatchers")
        shard_count = self.settings.shard_count
        weights = await self.working_set.shard_counts(list(range(shard_count)))
        current: dict[int, str | None] = {}
        for shard in range(shard_count):
            owner = view.owners.get(shard, ("", 0, 0))[0]
            current[shard] = owner if owner in view.members else coordinator.desired_owner(shard)
        plan = balanced_plan(shard_count, current, members, weights)
        moves = diff(current, plan, weights)
        if not request.dry_run:
            await self.redis.hset(ASSIGNMENT_KEY, mapping={str(s): o for s, o in plan.items()})
            log.info("rebalance applied", moves=len(moves), members=members)
            coordinator.wake()
        return pb.RebalanceResponse(
            moves=[
                pb.ShardMove(shard=m.shard, source=m.source or "", target=m.target, pending=m.weight)
                for m in moves
            ],
            applied=not request.dry_run,
        )

    @rpc
    async def PushJobs(self, request: pb.PushJobsRequest, context: Any) -> pb.PushJobsResponse:
        if request.shard >= self.settings.shard_count:
            raise InvalidArgument(f"shard: {request.shard} is not a shard")
        if len(request.jobs) > MAX_PUSH:
            raise InvalidArgument(f"jobs: at most {MAX_PUSH}")
        if not self.ownership.owns(request.shard):
            raise NotOwner(f"shard {request.shard} is not owned here")
        # A hand-off is checked like the enqueue it comes from: what it queues is trusted from then on.
        records: dict[bytes, JobRecord] = {}  # jobs alike come with the same record: check it once
        now, settings = wall_ms(), self.settings
        jobs = [
            _pushed_job(j, f"jobs[{i}]", request.shard, settings, now, records)
            for i, j in enumerate(request.jobs)
        ]
        await self.ingest.take(request.shard, jobs)
        return pb.PushJobsResponse()


def _pushed_job(
    job: pb.PushedJob,
    field: str,
    shard: int,
    settings: Settings,
    now: int,
    records: dict[bytes, JobRecord],
) -> NewJob:
    validation.job_id(job.id, f"{field}.id")
    if len(job.payload) > settings.max_payload_bytes:
        raise InvalidArgument(
            f"{field}.payload: {len(job.payload)} bytes is over the limit of {settings.max_payload_bytes}"
        )
    record = records.get(job.record)
    if record is None:
        try:
            record = JobRecord.unpack(job.record)
        except Exception as exc:  # msgpack errors, missing keys, bad values: not a record we wrote
            raise InvalidArgument(f"{field}.record: not a job record ({type(exc).__name__})") from None
        _check_new_record(record, f"{field}.record", shard, settings.shard_count, now)
        records[job.record] = record
    return NewJob(job.id, record, job.payload)


def _check_new_record(record: JobRecord, field: str, shard: int, shard_count: int, now: int) -> None:
    """The record of a job just enqueued (ingest makes it), within the limits an enqueue checks."""
    job_type = validation.job_type(record.type, f"{field}.type")
    if shard_for(job_type, shard_count) != shard:
        raise InvalidArgument(f"{field}.type: {job_type!r} is of shard {shard_for(job_type, shard_count)}")
    fresh = (record.attempts, record.failures, record.expirations, record.deadline_ms) == (0, 0, 0, 0)
    if (
        record.state not in (JobState.DELAYED, JobState.READY)
        or not fresh
        or record.token
        or record.cancel_requested
        or record.dead_reason
        or record.rate_limited
    ):
        raise InvalidArgument(
            f"{field}: not a new job's record (state {record.state}, attempts {record.attempts})"
        )
    if not 1 <= record.max_attempts <= validation.MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument(f"{field}.max_attempts: must be in 1..{validation.MAX_ATTEMPTS_LIMIT}")
    if not validation.MIN_LEASE_TTL_MS <= record.lease_ttl_ms <= validation.MAX_LEASE_TTL_MS:
        raise InvalidArgument(
            f"{field}.lease_ttl_ms: must be in {validation.MIN_LEASE_TTL_MS}..{validation.MAX_LEASE_TTL_MS}"
        )
    if not 0 < record.run_at_ms <= now + validation.MAX_HORIZON_MS:
        raise InvalidArgument(f"{field}.run_at_ms: must be a Unix time in ms, at most a century ahead")
    if not 0 < record.enqueued_at_ms <= now + validation.MAX_HORIZON_MS:
        raise InvalidArgument(f"{field}.enqueued_at_ms: must be a Unix time in ms")
    key = record.idempotency_key
    if len(key) > validation.MAX_KEY_LENGTH or not key.isprintable():
        raise InvalidArgument(f"{field}.idempotency_key: not an idempotency key")
    if record.concurrency_key:
        flow.concurrency_key(record.concurrency_key, f"{field}.concurrency_key")
    headers = record.headers
    if headers is not None:
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise InvalidArgument(f"{field}.headers: not a map of strings")
        validation.job_headers(headers, f"{field}.headers", internal=True)

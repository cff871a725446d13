"""ShardService: the shard map, live rebalancing, and hand-offs of new jobs between members."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from shardmap import balanced_plan, diff

from . import validation
from ._pb import shardq_pb2 as pb
from ._pb import shardq_pb2_grpc as pb_grpc
from .errors import InvalidArgument, NotOwner, Unavailable
from .job_service import rpc
from .keys import ASSIGNMENT_KEY
from .records import JobRecord
from .working_set import NewJob

if TYPE_CHECKING:
    from .app import Dispatcher

log = structlog.get_logger("shardq.shard_service")
MAX_PUSH = 20_000


class ShardService(pb_grpc.ShardServiceServicer):
    def __init__(self, app: Dispatcher) -> None:
        self.app = app

    @rpc
    async def GetShardMap(self, request: pb.GetShardMapRequest, context: Any) -> pb.GetShardMapResponse:
        view = await self.app.coordinator.refresh()
        shard_count = self.app.settings.shard_count
        pending = await self.app.working_set.shard_counts(list(range(shard_count)))
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
                    assigned=self.app.coordinator.desired_owner(shard) or "",
                )
            )
        members = [pb.Member(id=m, address=a, alive=m in view.members) for m, a in sorted(view.known.items())]
        return pb.GetShardMapResponse(shard_count=shard_count, members=members, shards=shards)

    @rpc
    async def Rebalance(self, request: pb.RebalanceRequest, context: Any) -> pb.RebalanceResponse:
        coordinator = self.app.coordinator
        view = await coordinator.refresh()
        members = sorted(view.members)
        if not members:
            raise Unavailable("no live dispatchers")
        shard_count = self.app.settings.shard_count
        weights = await self.app.working_set.shard_counts(list(range(shard_count)))
        current: dict[int, str | None] = {}
        for shard in range(shard_count):
            owner = view.owners.get(shard, ("", 0, 0))[0]
            current[shard] = owner if owner in view.members else coordinator.desired_owner(shard)
        plan = balanced_plan(shard_count, current, members, weights)
        moves = diff(current, plan, weights)
        if not request.dry_run:
            await self.app.redis.hset(ASSIGNMENT_KEY, mapping={str(s): o for s, o in plan.items()})
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
        if request.shard >= self.app.settings.shard_count:
            raise InvalidArgument(f"shard: {request.shard} is not a shard")
        if len(request.jobs) > MAX_PUSH:
            raise InvalidArgument(f"jobs: at most {MAX_PUSH}")
        if not self.app.ownership.owns(request.shard):
            raise NotOwner(f"shard {request.shard} is not owned here")
        records: dict[bytes, JobRecord] = {}  # jobs alike come with the same record: read it once
        jobs = [_pushed_job(j, f"jobs[{i}]", records) for i, j in enumerate(request.jobs)]
        await self.app.ingest.take(request.shard, jobs)
        return pb.PushJobsResponse()


def _pushed_job(job: pb.PushedJob, field: str, records: dict[bytes, JobRecord]) -> NewJob:
    validation.job_id(job.id, f"{field}.id")
    record = records.get(job.record)
    if record is None:
        try:
            record = records[job.record] = JobRecord.unpack(job.record)
        except Exception as exc:  # msgpack errors, missing keys, bad values: not a record we wrote
            raise InvalidArgument(f"{field}.record: not a job record ({type(exc).__name__})") from None
    return NewJob(job.id, record, job.payload)

"""QueueService: flow control of job types (pause, concurrency and rate limits, per concurrency key
too). A change is a DB write, mirrored into Redis at once (flow_mirror.py); the lease script of the
type's shard enforces it from its next round.

A "queue" is a job type: any valid type name may be given settings, with jobs or not yet (limits
and pauses are declared ahead of the jobs they hold back). A name that is not a valid job type is
INVALID_ARGUMENT; there is no NOT_FOUND: a type nobody configured has the defaults (running, no
limit).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc

from ..queue import validation
from ..queue.flow import QueueSettings, Rate
from ..queue.flow_settings import FIELDS, FlowSettings, classes_of, fields_of, pausing, resuming
from ..queue.keys import ShardKeys
from ..queue.working_set import WorkingSet
from . import auth
from .status import rpc

MAX_LISTED = 10_000  # types a ListQueues answers with


class QueueService(pb_grpc.QueueServiceServicer):
    def __init__(self, flow: FlowSettings, working_set: WorkingSet, shard_count: int) -> None:
        self.flow = flow
        self.working_set = working_set
        self.shard_count = shard_count

    @rpc
    async def SetQueueSettings(self, request: pb.SetQueueSettingsRequest, context: Any) -> pb.QueueInfo:
        job_type = validation.job_type(request.type, "type")
        names = list(request.fields) or list(FIELDS)
        for i, name in enumerate(request.fields):
            if name not in FIELDS:
                raise InvalidArgument(
                    f"fields[{i}]: {name[:60]!r} is not a setting (one of {', '.join(FIELDS)})"
                )
        given = settings_from_pb(job_type, request.settings, "settings")
        settings, _ = await self.flow.change(job_type, fields_of(given, names), field_prefix="settings.")
        return await self._info(settings, await self._updated_at(job_type))

    @rpc
    async def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> pb.QueueInfo:
        auth.check_types([request.type], "type")
        settings, updated_at = await self.flow.get(request.type)
        return await self._info(settings, updated_at)

    @rpc
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesResponse:
        configured = await self.flow.all()
        counts = await self.working_set.counts(range(self.shard_count))
        known = set(configured) | {job_type for job_type, _, _ in counts}
        types = sorted(t for t in known if auth.may_use(t))[:MAX_LISTED]
        by_type: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for (job_type, _, state), n in counts.items():
            by_type[job_type][state] += n
        out = []
        for job_type in types:
            settings, updated_at = configured.get(job_type) or (QueueSettings(job_type), 0)
            out.append(await self._info(settings, updated_at, by_type.get(job_type, {})))
        return pb.ListQueuesResponse(queues=out)

    @rpc
    async def PauseQueue(self, request: pb.PauseQueueRequest, context: Any) -> pb.QueueInfo:
        return await self._pause_or_resume(request, pause=True)

    @rpc
    async def ResumeQueue(self, request: pb.PauseQueueRequest, context: Any) -> pb.QueueInfo:
        return await self._pause_or_resume(request, pause=False)

    async def _pause_or_resume(self, request: pb.PauseQueueRequest, *, pause: bool) -> pb.QueueInfo:
        job_type = validation.job_type(request.type, "type")
        priority = None if request.priority == pb.PRIORITY_UNSPECIFIED else request.priority
        classes = classes_of(None if priority is None else validation.priority(priority, "priority"))
        settings, _ = await self.flow.change(job_type, (pausing if pause else resuming)(classes))
        return await self._info(settings, await self._updated_at(job_type))

    async def _updated_at(self, job_type: str) -> int:
        return (await self.flow.get(job_type))[1]

    async def _info(
        self, settings: QueueSettings, updated_at: int, states: dict[str, int] | None = None
    ) -> pb.QueueInfo:
        job_type = settings.job_type
        shard = self.flow.mirror.shard_of(job_type)
        if states is None:
            states = defaultdict(int)
            for (t, _, state), n in (await self.working_set.counts([shard])).items():
                if t == job_type:
                    states[state] += n
        running_keys = await self.working_set.redis.hgetall(ShardKeys(shard).key_running(job_type))
        keys_running = keys_at_limit = 0
        for raw_key, raw_n in running_keys.items():
            n = int(raw_n)
            if n <= 0:
                continue
            keys_running += 1
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            limit = settings.key_concurrency_overrides.get(key, settings.key_concurrency)
            if limit and n >= limit:
                keys_at_limit += 1
        return pb.QueueInfo(
            type=job_type,
            settings=settings_to_pb(settings),
            shard=shard,
            delayed=states.get("delayed", 0),
            ready=states.get("ready", 0),
            running=states.get("leased", 0),
            keys_running=keys_running,
            keys_at_limit=keys_at_limit,
            updated_at_ms=updated_at,
        )


def settings_from_pb(job_type: str, message: pb.QueueSettings, field: str) -> QueueSettings:
    """The message's settings, not validated yet (QueueSettings.validated names the field)."""
    paused = set()
    for i, value in enumerate(message.paused):
        if value == pb.PRIORITY_UNSPECIFIED:
            raise InvalidArgument(f"{field}.paused[{i}]: give a priority class (high, default or low)")
        paused.add(validation.priority(value, f"{field}.paused[{i}]"))

    def rate(name: str) -> Rate | None:
        if not message.HasField(name):  # type: ignore[arg-type]
            return None
        bucket = getattr(message, name)
        return Rate(bucket.per_s, bucket.burst)

    return QueueSettings(
        job_type,
        paused=frozenset(paused),
        concurrency=message.concurrency,
        key_concurrency=message.key_concurrency,
        key_concurrency_overrides=dict(message.key_concurrency_overrides),
        key_weights=dict(message.key_weights),
        rate=rate("rate"),
        key_rate=rate("key_rate"),
        retain_finished_s=message.retain_finished_s,
        retain_dead_s=message.retain_dead_s,
    )


def settings_to_pb(settings: QueueSettings) -> pb.QueueSettings:
    message = pb.QueueSettings(
        paused=sorted(validation.priority_to_pb(p) for p in settings.paused),
        concurrency=settings.concurrency,
        key_concurrency=settings.key_concurrency,
        key_concurrency_overrides=dict(settings.key_concurrency_overrides),
        key_weights=dict(settings.key_weights),
        retain_finished_s=settings.retain_finished_s,
        retain_dead_s=settings.retain_dead_s,
    )
    if settings.rate is not None:
        message.rate.CopyFrom(pb.TokenBucket(per_s=settings.rate.per_s, burst=settings.rate.burst))
    if settings.key_rate is not None:
        message.key_rate.CopyFrom(
            pb.TokenBucket(per_s=settings.key_rate.per_s, burst=settings.key_rate.burst)
        )
    return message

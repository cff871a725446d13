"""ScheduleService: recurring jobs. Changes are DB writes; each shard's owner applies them at its
next tick (dispatcher/schedules/scheduler.py), which is woken at once when it is this process."""

from __future__ import annotations

from typing import Any

import structlog

from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument, NotFound
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc

from ..schedules.scheduler import Scheduler
from ..schedules.spec import log_change, schedule_name, to_pb
from ..store import ScheduleRow, Store
from . import auth
from .status import rpc

log = structlog.get_logger("shardq.schedules")
MAX_NEXT = 1000


class ScheduleService(pb_grpc.ScheduleServiceServicer):
    def __init__(self, store: Store, scheduler: Scheduler) -> None:
        self.store = store
        self.scheduler = scheduler

    @rpc
    async def UpsertSchedule(
        self, request: pb.UpsertScheduleRequest, context: Any
    ) -> pb.UpsertScheduleResponse:
        row, created, changed = await self.scheduler.declare(request.schedule)
        return pb.UpsertScheduleResponse(schedule=to_pb(row), created=created, changed=changed)

    @rpc
    async def GetSchedule(self, request: pb.GetScheduleRequest, context: Any) -> pb.Schedule:
        row = await self._get(request.name)
        auth.check_types([row.type], "name")
        return to_pb(row)

    @rpc
    async def ListSchedules(self, request: pb.ListSchedulesRequest, context: Any) -> pb.ListSchedulesResponse:
        rows = await self.store.list_schedules(request.type)
        return pb.ListSchedulesResponse(schedules=[to_pb(r) for r in rows if auth.may_use(r.type)])

    @rpc
    async def PauseSchedule(self, request: pb.ScheduleNameRequest, context: Any) -> pb.Schedule:
        return to_pb(await self._set_enabled(request.name, False))

    @rpc
    async def ResumeSchedule(self, request: pb.ScheduleNameRequest, context: Any) -> pb.Schedule:
        return to_pb(await self._set_enabled(request.name, True))

    @rpc
    async def DeleteSchedule(
        self, request: pb.ScheduleNameRequest, context: Any
    ) -> pb.DeleteScheduleResponse:
        name = schedule_name(request.name)
        deleted = await self.store.delete_schedule(name)
        if not deleted:
            raise NotFound(f"no schedule {name}")
        self.scheduler.wake.set()
        log.info("schedule deleted", schedule=name)
        return pb.DeleteScheduleResponse(deleted=True)

    @rpc
    async def NextOccurrences(
        self, request: pb.NextOccurrencesRequest, context: Any
    ) -> pb.NextOccurrencesResponse:
        count = request.count or 5
        if count > MAX_NEXT:
            raise InvalidArgument(f"count: at most {MAX_NEXT}")
        row = await self._get(request.name)
        auth.check_types([row.type], "name")
        cron = self.scheduler.cron_of(row)
        found = cron.occurrences(wall_ms(), wall_ms() + 400 * 86_400_000, count)
        return pb.NextOccurrencesResponse(occurrences_ms=found, timezone=row.timezone)

    async def _get(self, name: str) -> ScheduleRow:
        name = schedule_name(name)
        row = await self.store.get_schedule(name)
        if row is None:
            raise NotFound(f"no schedule {name}")
        return row

    async def _set_enabled(self, name: str, enabled: bool) -> ScheduleRow:
        name = schedule_name(name)
        current = await self.store.get_schedule(name)
        if current is None:
            raise NotFound(f"no schedule {name}")
        row = await self.store.set_schedule_enabled(name, enabled)
        if row is None:
            raise NotFound(f"no schedule {name}")
        if row.version != current.version:
            self.scheduler.wake.set()
            log_change(row, "resumed" if enabled else "paused")
        return row

"""Clients for JobService: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from dispatcher._pb import shardq_pb2 as pb
from dispatcher._pb import shardq_pb2_grpc as pb_grpc
from dispatcher.errors import ConfigError
from dispatcher.tls import ChannelSecurity

from ._convert import STATUS_NAMES, JobInfo, QueueStats, dead_filter, job_spec
from ._errors import from_rpc_error
from ._pipelining import EnqueuePipeline
from ._routing import OwnerRoutes
from ._schedules import Schedule, ScheduleInfo, schedule_from

DEFAULT_TARGET = "127.0.0.1:7070"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]


def resolve_target(target: str | None) -> str:
    return target or os.environ.get("SHARDQ_TARGET") or DEFAULT_TARGET


def resolve_security(
    token: str | None = None,
    tls: bool | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
) -> ChannelSecurity:
    """How to reach the dispatcher; each option falls back to the environment when not given.

    ``token`` (SHARDQ_TOKEN) is sent as ``authorization: Bearer <token>`` on every call. ``tls``
    (SHARDQ_TLS=1) turns TLS on, checking the server against the system roots or ``tls_ca``
    (SHARDQ_TLS_CA, a PEM file; giving one turns TLS on). ``tls_cert``/``tls_key``
    (SHARDQ_TLS_CLIENT_CERT/_KEY) are a client certificate for dispatchers that require mutual TLS.
    ``tls_server_name`` (SHARDQ_TLS_SERVER_NAME) is the name to check in the server's certificate
    instead of the target's host. A token on a plaintext channel can be read off the network: use
    TLS beyond loopback.
    """
    try:
        return ChannelSecurity.resolve(
            token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name,
        )  # fmt: skip
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _specs(jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[pb.JobSpec]:
    out = []
    for job in jobs:
        if isinstance(job, pb.JobSpec):
            out.append(job)
        else:
            fields = dict(job)
            out.append(job_spec(fields.pop("type"), fields.pop("payload", None), **fields))
    return out


class Client:
    """Blocking client. ``enqueue`` returns once the job is committed to the dispatcher's database.
    Safe to share between threads.

    ``token``, ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_server_name``: see
    :func:`resolve_security` (defaults from SHARDQ_TOKEN and SHARDQ_TLS*). ``route=True`` sends each
    enqueue straight to the dispatcher process that owns the job type's shard (see ``_routing``).
    """

    def __init__(
        self, target: str | None = None, *, timeout: float = 30.0, route: bool = False, **security: Any
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.security = resolve_security(**security)
        self._metadata = self.security.metadata
        self._channel = self.security.channel(self.target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.JobServiceStub(self._channel)
        self._shards = pb_grpc.ShardServiceStub(self._channel)
        self._schedules = pb_grpc.ScheduleServiceStub(self._channel)
        self._routes = OwnerRoutes(self.target) if route else None
        self._map_lock = threading.Lock()  # held by the one thread re-reading the shard map
        self._owner_lock = threading.Lock()
        self._owner_stubs: dict[str, Any] = {}
        self._owner_channels: list[grpc.Channel] = []

    def _call(self, method: str, request: Any, stub: Any = None) -> Any:
        try:
            return getattr(stub or self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def _call_at(self, address: str, method: str, request: Any) -> Any:
        if address == self.target or self._routes is None:
            return self._call(method, request)
        try:
            return getattr(self._owner_stub(address), method)(
                request, timeout=self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            if self._routes.failed(address, exc):
                return self._call(method, request)
            raise from_rpc_error(exc) from None

    def _owner_stub(self, address: str) -> Any:
        with self._owner_lock:
            stub = self._owner_stubs.get(address)
            if stub is None:
                channel = self.security.channel(address, options=CHANNEL_OPTIONS)
                self._owner_channels.append(channel)
                stub = self._owner_stubs[address] = pb_grpc.JobServiceStub(channel)
            return stub

    def _address_of(self, job_types: list[str]) -> str:
        """Where jobs of these types go together. One thread re-reads a stale shard map while the
        others go on with the one they have (or wait for it, when there is none yet)."""
        routes = self._routes
        if routes is None:
            return self.target
        if routes.stale() and self._map_lock.acquire(blocking=not routes.known):
            try:
                if routes.stale():
                    routes.update(self._read_map())
            finally:
                self._map_lock.release()
        return routes.address_for(job_types)

    def _read_map(self) -> pb.GetShardMapResponse | None:
        try:
            return self._shards.GetShardMap(
                pb.GetShardMapRequest(), timeout=min(self.timeout, 5.0), metadata=self._metadata
            )
        except grpc.RpcError:
            return None  # the target takes every job until the next try

    def shard_map(self) -> pb.GetShardMapResponse:
        """Which dispatcher owns which shard (any dispatcher answers)."""
        return self._call("GetShardMap", pb.GetShardMapRequest(), self._shards)

    def rebalance(self, *, dry_run: bool = False) -> pb.RebalanceResponse:
        """Balance the shards over the live dispatchers; with dry_run, only return the plan."""
        return self._call("Rebalance", pb.RebalanceRequest(dry_run=dry_run), self._shards)

    def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> str:
        """Enqueue one job; returns its id (the existing job's id when a job of the same type has the
        idempotency key: keys are unique per job type).

        Options: priority ("high", "default", "low"), run_at (aware datetime or epoch seconds), delay
        (seconds or timedelta), max_attempts, lease_ttl (seconds), idempotency_key.
        """
        spec = job_spec(job_type, payload, **options)
        response = self._call_at(self._address_of([spec.type]), "Enqueue", pb.EnqueueRequest(job=spec))
        return str(response.job_id)

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[str]:
        """Enqueue a batch in one round trip (one DB transaction); each job is a dict of enqueue's
        arguments with "type" and "payload" keys. It goes to the shards' owner when the jobs share
        one, else to the target (which hands each shard's jobs to its owner). A dispatcher takes at
        most SHARDQ_MAX_BATCH jobs (10,000) and SHARDQ_MAX_REQUEST_BYTES (64 MiB) in one call, by
        default: split larger batches (RESOURCE_EXHAUSTED or INVALID_ARGUMENT otherwise)."""
        specs = _specs(jobs)
        address = self._address_of([s.type for s in specs])
        return list(self._call_at(address, "EnqueueMany", pb.EnqueueManyRequest(jobs=specs)).job_ids)

    def get_job(self, job_id: str) -> JobInfo:
        return JobInfo.from_pb(self._call("GetJob", pb.GetJobRequest(job_id=job_id)))

    def cancel(self, job_id: str) -> str:
        """Returns "cancelled" (it will never run), "leased" (running now; it will not be retried) or the
        terminal status it already had."""
        return STATUS_NAMES[self._call("CancelJob", pb.CancelJobRequest(job_id=job_id)).status]

    def stats(self) -> list[QueueStats]:
        return [QueueStats.from_pb(q) for q in self._call("Stats", pb.StatsRequest()).queues]

    def dead_letters(
        self, *, job_type: str | None = None, reason: str | None = None, limit: int = 100, after_id: str = ""
    ) -> list[JobInfo]:
        request = pb.ListDeadRequest(filter=dead_filter(job_type, reason), limit=limit, after_id=after_id)
        return [JobInfo.from_pb(j) for j in self._call("ListDead", request).jobs]

    def requeue_dead(
        self,
        job_ids: Iterable[str] = (),
        *,
        all: bool = False,
        job_type: str | None = None,
        reason: str | None = None,
    ) -> int:
        request = pb.RequeueDeadRequest(job_ids=list(job_ids), all=all, filter=dead_filter(job_type, reason))
        return int(self._call("RequeueDead", request).requeued)

    def purge_dead(self, *, job_type: str | None = None, reason: str | None = None) -> int:
        return int(self._call("PurgeDead", pb.PurgeDeadRequest(filter=dead_filter(job_type, reason))).purged)

    def version(self) -> pb.GetVersionResponse:
        return self._call("GetVersion", pb.GetVersionRequest())

    # -- schedules ---------------------------------------------------------------------

    def upsert_schedule(self, schedule: Schedule | None = None, **fields: Any) -> tuple[ScheduleInfo, bool]:
        """Create or replace a schedule by name (a Schedule, or its fields as keywords). Returns it
        and whether anything changed: declaring the same schedule again does nothing."""
        request = pb.UpsertScheduleRequest(schedule=schedule_from(schedule, fields))
        response = self._call("UpsertSchedule", request, self._schedules)
        return ScheduleInfo.from_pb(response.schedule), bool(response.created or response.changed)

    def get_schedule(self, name: str) -> ScheduleInfo:
        return ScheduleInfo.from_pb(
            self._call("GetSchedule", pb.GetScheduleRequest(name=name), self._schedules)
        )

    def schedules(self, job_type: str = "") -> list[ScheduleInfo]:
        response = self._call("ListSchedules", pb.ListSchedulesRequest(type=job_type), self._schedules)
        return [ScheduleInfo.from_pb(s) for s in response.schedules]

    def pause_schedule(self, name: str) -> ScheduleInfo:
        request = pb.ScheduleNameRequest(name=name)
        return ScheduleInfo.from_pb(self._call("PauseSchedule", request, self._schedules))

    def resume_schedule(self, name: str) -> ScheduleInfo:
        request = pb.ScheduleNameRequest(name=name)
        return ScheduleInfo.from_pb(self._call("ResumeSchedule", request, self._schedules))

    def delete_schedule(self, name: str) -> None:
        self._call("DeleteSchedule", pb.ScheduleNameRequest(name=name), self._schedules)

    def next_occurrences(self, name: str, count: int = 5) -> tuple[list[int], str]:
        """The coming occurrences (epoch ms) and the schedule's time zone."""
        request = pb.NextOccurrencesRequest(name=name, count=count)
        response = self._call("NextOccurrences", request, self._schedules)
        return list(response.occurrences_ms), response.timezone

    def close(self) -> None:
        for channel in self._owner_channels:
            channel.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client with the same methods and options as ``Client`` (``route`` included), awaited."""

    def __init__(
        self, target: str | None = None, *, timeout: float = 30.0, route: bool = False, **security: Any
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.security = resolve_security(**security)
        self._metadata = self.security.metadata
        self._channel = self.security.aio_channel(self.target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.JobServiceStub(self._channel)
        self._schedules = pb_grpc.ScheduleServiceStub(self._channel)
        self._pipeline = EnqueuePipeline(self._enqueue_one, self._enqueue_specs)
        self._routes = OwnerRoutes(self.target) if route else None
        self._map_read: asyncio.Future[None] | None = None
        self._owner_stubs: dict[str, Any] = {}
        self._owner_channels: list[grpc.aio.Channel] = []

    async def _call(self, method: str, request: Any, stub: Any = None) -> Any:
        try:
            return await getattr(stub or self._stub, method)(
                request, timeout=self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> str:
        """Enqueue one job; returns its id once it is committed. Calls made concurrently (in the same
        turn of the event loop) to the same dispatcher share one round trip; each still gets its own
        id or error."""
        spec = job_spec(job_type, payload, **options)
        return await self._pipeline.enqueue(spec, await self._address_of([spec.type]))

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[str]:
        """One call and one transaction: to the shards' owner when the jobs share one, else to the
        target (which hands each shard's jobs to its owner)."""
        specs = _specs(jobs)
        return await self._enqueue_specs(specs, await self._address_of([s.type for s in specs]))

    async def _enqueue_one(self, spec: pb.JobSpec, address: str) -> str:
        return str((await self._call_at(address, "Enqueue", pb.EnqueueRequest(job=spec))).job_id)

    async def _enqueue_specs(self, specs: list[pb.JobSpec], address: str) -> list[str]:
        response = await self._call_at(address, "EnqueueMany", pb.EnqueueManyRequest(jobs=specs))
        return list(response.job_ids)

    async def _address_of(self, job_types: list[str]) -> str:
        """Where jobs of these types go together (reading the shard map first if it is unknown)."""
        routes = self._routes
        if routes is None:
            return self.target
        if routes.stale():
            if self._map_read is None or self._map_read.done():
                self._map_read = asyncio.ensure_future(self._read_map())
            if not routes.known:
                await asyncio.shield(self._map_read)
        return routes.address_for(job_types)

    async def _read_map(self) -> None:
        assert self._routes is not None
        try:
            view = await pb_grpc.ShardServiceStub(self._channel).GetShardMap(
                pb.GetShardMapRequest(), timeout=min(self.timeout, 5.0), metadata=self._metadata
            )
        except grpc.RpcError:
            view = None  # the target takes every job until the next try
        self._routes.update(view)

    async def _call_at(self, address: str, method: str, request: Any) -> Any:
        if address == self.target or self._routes is None:
            return await self._call(method, request)
        stub = self._owner_stubs.get(address)
        if stub is None:
            channel = self.security.aio_channel(address, options=CHANNEL_OPTIONS)
            self._owner_channels.append(channel)
            stub = self._owner_stubs[address] = pb_grpc.JobServiceStub(channel)
        try:
            return await getattr(stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            if self._routes.failed(address, exc):
                return await self._call(method, request)
            raise from_rpc_error(exc) from None

    async def get_job(self, job_id: str) -> JobInfo:
        return JobInfo.from_pb(await self._call("GetJob", pb.GetJobRequest(job_id=job_id)))

    async def cancel(self, job_id: str) -> str:
        return STATUS_NAMES[(await self._call("CancelJob", pb.CancelJobRequest(job_id=job_id))).status]

    async def stats(self) -> list[QueueStats]:
        return [QueueStats.from_pb(q) for q in (await self._call("Stats", pb.StatsRequest())).queues]

    async def dead_letters(
        self, *, job_type: str | None = None, reason: str | None = None, limit: int = 100, after_id: str = ""
    ) -> list[JobInfo]:
        request = pb.ListDeadRequest(filter=dead_filter(job_type, reason), limit=limit, after_id=after_id)
        return [JobInfo.from_pb(j) for j in (await self._call("ListDead", request)).jobs]

    async def requeue_dead(
        self,
        job_ids: Iterable[str] = (),
        *,
        all: bool = False,
        job_type: str | None = None,
        reason: str | None = None,
    ) -> int:
        request = pb.RequeueDeadRequest(job_ids=list(job_ids), all=all, filter=dead_filter(job_type, reason))
        return int((await self._call("RequeueDead", request)).requeued)

    async def purge_dead(self, *, job_type: str | None = None, reason: str | None = None) -> int:
        request = pb.PurgeDeadRequest(filter=dead_filter(job_type, reason))
        return int((await self._call("PurgeDead", request)).purged)

    async def upsert_schedule(
        self, schedule: Schedule | None = None, **fields: Any
    ) -> tuple[ScheduleInfo, bool]:
        request = pb.UpsertScheduleRequest(schedule=schedule_from(schedule, fields))
        response = await self._call("UpsertSchedule", request, self._schedules)
        return ScheduleInfo.from_pb(response.schedule), bool(response.created or response.changed)

    async def get_schedule(self, name: str) -> ScheduleInfo:
        request = pb.GetScheduleRequest(name=name)
        return ScheduleInfo.from_pb(await self._call("GetSchedule", request, self._schedules))

    async def schedules(self, job_type: str = "") -> list[ScheduleInfo]:
        response = await self._call("ListSchedules", pb.ListSchedulesRequest(type=job_type), self._schedules)
        return [ScheduleInfo.from_pb(s) for s in response.schedules]

    async def delete_schedule(self, name: str) -> None:
        await self._call("DeleteSchedule", pb.ScheduleNameRequest(name=name), self._schedules)

    async def close(self) -> None:
        if self._map_read is not None:
            self._map_read.cancel()
        for channel in self._owner_channels:
            await channel.close()
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

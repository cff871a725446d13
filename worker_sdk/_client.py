"""Clients for JobService: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc

from shardq_common.errors import ConfigError
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity

from . import _calls as calls
from . import _tracing
from . import _waiting as waiting
from ._calls import Call
from ._convert import (
    Identity,
    JobInfo,
    QueueStats,
    RebalancePlan,
    ShardMap,
    StatsSnapshot,
    VersionInfo,
    WorkerInfo,
    job_spec,
)
from ._enqueue_stream import AsyncEnqueueStream, Attempts, BlockingEnqueueStream
from ._errors import from_rpc_error
from ._pipelining import EnqueuePipeline
from ._queues import QueueInfo, QueueSettings
from ._routing import OwnerRoutes
from ._schedules import Schedule, ScheduleInfo
from ._search import BulkResult, JobFilter, JobPage
from ._workflows import Batch, OpenBatch

T = TypeVar("T")
# A channel to an owner the shard map no longer names is closed once every call sent there has met
# its deadline: the client's timeout after the first map without it, and this much more.
RETIRE_SLACK_S = 1.0

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


def _stubs(channel: grpc.Channel | grpc.aio.Channel) -> dict[str, Any]:
    return {
        calls.JOBS: pb_grpc.JobServiceStub(channel),
        calls.SHARDS: pb_grpc.ShardServiceStub(channel),
        calls.SCHEDULES: pb_grpc.ScheduleServiceStub(channel),
        calls.QUEUES: pb_grpc.QueueServiceStub(channel),
        calls.WORKERS: pb_grpc.WorkerServiceStub(channel),
    }


class _ClientOptions:
    """What both clients are built from. ``token``, ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``,
    ``tls_server_name``: see :func:`resolve_security` (defaults from SHARDQ_TOKEN and SHARDQ_TLS*)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        timeout: float = 30.0,
        route: bool = False,
        token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.target = resolve_target(target)
        self.timeout = timeout
        self.security = resolve_security(
            token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name,
        )  # fmt: skip
        self._metadata = self.security.metadata
        self._routes = OwnerRoutes(self.target) if route else None
        self._owner_stubs: dict[str, dict[str, Any]] = {}
        self._owner_channels: list[Any] = []
        self._owner_channel_of: dict[str, Any] = {}
        self._open()

    _stubs: dict[str, Any]  # the target's (``_open``)

    def _open(self) -> None:
        raise NotImplementedError

    def _new_channel(self, address: str) -> Any:
        raise NotImplementedError

    def _owner_stubs_of(self, address: str) -> dict[str, Any]:
        """A routed owner's stubs, its channel opened on first use (``Client`` holds ``_owner_lock``)."""
        stubs: dict[str, Any] | None = self._owner_stubs.get(address)
        if stubs is None:
            channel = self._new_channel(address)
            self._owner_channels.append(channel)
            self._owner_channel_of[address] = channel
            stubs = self._owner_stubs[address] = _stubs(channel)
        return stubs

    def _stream_method(self, address: str) -> Any:
        """The ``EnqueueStream`` method of ``address``'s stubs (the target's or an owner's)."""
        stubs = self._stubs if address == self.target else self._owner_stubs_of(address)
        return stubs[calls.JOBS].EnqueueStream


class Client(_ClientOptions):
    """Blocking client. ``enqueue`` returns once the job is committed to the dispatcher's database.
    Safe to share between threads.

    ``target``: the dispatcher's address (default ``SHARDQ_TARGET`` or 127.0.0.1:7070); any
    dispatcher of a cluster answers every call. ``timeout``: seconds each call may take.
    ``token``, ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_server_name``: see
    :func:`resolve_security` (defaults from SHARDQ_TOKEN and SHARDQ_TLS*). ``route=True`` sends each
    enqueue straight to the dispatcher process that owns the job type's shard (see ``_routing``).
    """

    def _open(self) -> None:
        self._channel = self._new_channel(self.target)
        self._stubs = _stubs(self._channel)
        self._map_lock = threading.Lock()  # held by the one thread re-reading the shard map
        self._owner_lock = threading.Lock()
        self._streams: dict[str, BlockingEnqueueStream] = {}  # address -> its single enqueues' stream
        self._unary_only: set[str] = set()  # addresses of dispatchers without EnqueueStream

    # -- sending a call ------------------------------------------------------------------

    def _send(self, call: Call[T]) -> T:
        address = self.target if call.job_types is None else self._address_of(call.job_types)
        return self._send_to(address, call)

    def _send_to(self, address: str, call: Call[T]) -> T:
        try:
            reply = self._rpc_at(address, call)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return call.result(reply)

    def _enqueue_streamed(self, spec: pb.JobSpec) -> str:
        """One job on its address's EnqueueStream (see ``_enqueue_stream`` for its failures)."""
        attempts = Attempts(self._address_of((spec.type,)), self.target, self._routes)
        address = attempts.address
        while address not in self._unary_only:
            stream = self._stream_at(address)
            outcome = stream.send(spec, self.timeout)
            if not isinstance(outcome, pb.EnqueueStreamResponse):
                self._drop_stream(address, stream)
            step = attempts.settle(outcome)
            if isinstance(step, str):
                return step
            address = step.address
            if step.unary:
                self._unary_only.add(address)
        return self._send_to(address, calls.enqueue(spec))

    def _stream_at(self, address: str) -> BlockingEnqueueStream:
        with self._owner_lock:
            stream = self._streams.get(address)
            if stream is None:
                stream = self._streams[address] = BlockingEnqueueStream(
                    self._stream_method(address), self._metadata
                )
            return stream

    def _drop_stream(self, address: str, stream: BlockingEnqueueStream) -> None:
        with self._owner_lock:
            if self._streams.get(address) is stream:
                del self._streams[address]

    def _rpc(self, stubs: dict[str, Any], call: Call[Any], timeout: float | None = None) -> Any:
        method = getattr(stubs[call.service], call.method)
        timeout = self.timeout if timeout is None else timeout
        return method(call.request, timeout=timeout, metadata=self._metadata)

    def _rpc_at(self, address: str, call: Call[Any]) -> Any:
        if address == self.target or self._routes is None:
            return self._rpc(self._stubs, call)
        try:
            return self._rpc(self._owner_stubs_at(address), call)
        except grpc.RpcError as exc:
            if self._routes.failed(address, exc):
                return self._rpc(self._stubs, call)
            raise

    def _owner_stubs_at(self, address: str) -> dict[str, Any]:
        with self._owner_lock:
            return self._owner_stubs_of(address)

    def _new_channel(self, address: str) -> grpc.Channel:
        return self.security.channel(address, options=CHANNEL_OPTIONS)

    def _retire_owners(self, routes: OwnerRoutes) -> None:
        with self._owner_lock:
            for address in routes.retired(list(self._owner_stubs), self.timeout + RETIRE_SLACK_S):
                if (stream := self._streams.pop(address, None)) is not None:
                    stream.close()
                del self._owner_stubs[address]
                self._owner_channels.remove(channel := self._owner_channel_of.pop(address))
                channel.close()

    def _address_of(self, job_types: Iterable[str]) -> str:
        """Where jobs of these types go together. One thread re-reads a stale shard map while the
        others go on with the one they have (or wait for it, when there is none yet)."""
        routes = self._routes
        if routes is None:
            return self.target
        if routes.stale() and self._map_lock.acquire(blocking=not routes.known):
            try:
                if routes.stale():
                    view = self._read_map()
                    routes.update(view)
                    if view is not None:
                        self._retire_owners(routes)
            finally:
                self._map_lock.release()
        return routes.address_for(job_types)

    def _read_map(self) -> ShardMap | None:
        try:
            return ShardMap.from_pb(self._rpc(self._stubs, calls.shard_map(), timeout=min(self.timeout, 5.0)))
        except grpc.RpcError:
            return None  # the target takes every job until the next try

    # -- jobs ------------------------------------------------------------------------------

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        priority: str = "default",
        run_at: datetime | float | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int | None = None,
        lease_ttl: float | timedelta | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        depends_on: Iterable[str | tuple[str, str]] | None = None,
        on_failure: str = "fail",
    ) -> str:
        """Enqueue one job; returns its id once it is committed (the existing job's id when a job
        with this idempotency key exists).

        ``payload``: bytes as they are, anything else as JSON. ``priority``: "high", "default" or
        "low". ``run_at`` (an aware datetime or epoch seconds) or ``delay`` (seconds or a timedelta):
        when it becomes due. ``max_attempts``, ``lease_ttl`` (seconds): the dispatcher's defaults
        when not given. ``idempotency_key``: unique per job type; another job of the same type with
        the key makes this call return that job's id and create nothing. ``concurrency_key``: a
        tenant, a customer, an account id (up to 128 characters): the type's per-key limits apply to
        each key apart, and keys with ready jobs share the leases round robin. ``headers``: small
        string metadata delivered with the job (at most 16, 4 KiB in all); with OpenTelemetry
        installed the current trace context is added as ``traceparent``/``tracestate`` (see the
        README's tracing). ``depends_on``: job ids (or ``(id, policy)`` pairs) this job waits for:
        it stays "waiting" until each has finished; ``on_failure`` ("fail": cancelled when one is
        dead-lettered or cancelled; "ignore": runs anyway) applies to the plain ids.
        """
        spec = job_spec(
            job_type, payload, priority=priority, run_at=run_at, delay=delay, max_attempts=max_attempts,
            lease_ttl=lease_ttl, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
            headers=headers, depends_on=depends_on, on_failure=on_failure,
        )  # fmt: skip
        with _tracing.sending([spec]) as span:
            job_id = self._enqueue_streamed(spec)
            _tracing.sent(span, [job_id])
        return job_id

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[str]:
        """Enqueue a batch in one round trip (one DB transaction); each job is a dict of enqueue's
        arguments with "type" and "payload" keys. It goes to the shards' owner when the jobs share
        one, else to the target (which hands each shard's jobs to its owner). A dispatcher takes at
        most SHARDQ_MAX_BATCH jobs (10,000) and SHARDQ_MAX_REQUEST_BYTES (64 MiB) in one call, by
        default: split larger batches (RESOURCE_EXHAUSTED or INVALID_ARGUMENT otherwise)."""
        specs = calls.specs(jobs)
        with _tracing.sending(specs) as span:
            job_ids = self._send(calls.enqueue_many(specs))
            _tracing.sent(span, job_ids)
        return job_ids

    def enqueue_batch(self, batch: Batch, jobs: Iterable[Mapping[str, Any]]) -> OpenBatch:
        """Enqueue a batch's first jobs and its callbacks in one transaction (see ``Batch``)."""
        return batch.opened(self.enqueue_many(batch.specs(jobs)))

    def add_to_batch(self, batch: OpenBatch | str, jobs: Iterable[Mapping[str, Any]]) -> list[str]:
        """Add jobs to an open batch (an OpenBatch or its token), from a running job of the batch:
        its callbacks wait for them too. InvalidArgumentError once the batch's callbacks are no
        longer waiting (every job of it had finished)."""
        opened = OpenBatch.from_token(batch) if isinstance(batch, str) else batch
        return self.enqueue_many(opened.add_specs(jobs))

    def get_job(self, job_id: str) -> JobInfo:
        """The job as the dispatcher's database has it (NotFoundError when there is none)."""
        return self._send(calls.get_job(job_id))

    def watch(self, job_id: str, *, timeout: float | None = None) -> Iterator[JobInfo]:
        """The job now, then each change (status, attempts, ``progress``) as the dispatcher sees it,
        until it finishes (the last one yielded is finished). Streamed (WatchJob), not polled; a lost
        stream (a dispatcher restart) is opened again and resumes from the job's state in the DB.
        Raises TimeoutError after ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = waiting.FIRST_RETRY_S
        request = pb.WatchJobRequest(job_id=job_id)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise waiting.timed_out(job_id, timeout)
            stream = self._stubs[calls.JOBS].WatchJob(request, timeout=remaining, metadata=self._metadata)
            try:
                for event in stream:
                    delay = waiting.FIRST_RETRY_S
                    yield JobInfo.from_pb(event.job)
                    if event.final:
                        return
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise waiting.timed_out(job_id, timeout) from None
                if exc.code() not in waiting.RESUMABLE:
                    raise from_rpc_error(exc) from None
            finally:
                stream.cancel()
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = waiting.next_retry(delay)

    def wait(
        self, job_id: str, *, timeout: float | None = None, on_progress: Callable[[Any], None] | None = None
    ) -> Any:
        """Wait for the job to finish and return its result (the handler's return value, decoded from
        JSON; bytes that are not JSON as they are; None without one). Raises JobDeadError or
        JobCancelledError when it did not succeed, TimeoutError after ``timeout`` seconds (None: no
        limit; the job goes on). ``on_progress`` is called with each new ``ctx.progress`` report."""
        job: JobInfo | None = None
        reported: Any = None
        for job in self.watch(job_id, timeout=timeout):
            if on_progress is not None and job.progress is not None and job.progress != reported:
                reported = job.progress
                on_progress(job.progress)
        assert job is not None  # watch yields at least the final state
        return waiting.outcome(job)

    def cancel(self, job_id: str) -> str:
        """Returns "cancelled" (it will never run), "leased" (running now; it will not be retried) or the
        terminal status it already had."""
        return self._send(calls.cancel(job_id))

    def stats(self) -> list[QueueStats]:
        """Jobs delayed, ready, leased and dead per job type and priority."""
        return self._send(calls.stats())

    def stats_snapshot(self, *, counters_only: bool = False) -> StatsSnapshot:
        """Stats with the answering process's counters (see :class:`StatsSnapshot`)."""
        return self._send(calls.stats_snapshot(counters_only))

    def whoami(self) -> Identity:
        """Who this client's token stands for."""
        return self._send(calls.whoami())

    def workers(self) -> list[WorkerInfo]:
        """The workers connected to the target dispatcher process (each process lists its own)."""
        return self._send(calls.workers())

    def dead_letters(
        self, *, job_type: str | None = None, reason: str | None = None, limit: int = 100, after_id: str = ""
    ) -> list[JobInfo]:
        """Dead jobs, oldest first, optionally of one type or reason (one of ``DEAD_REASONS``); page
        on with ``after_id`` set to the last id of the previous page."""
        return self._send(calls.dead_letters(job_type, reason, limit, after_id))

    def requeue_dead(
        self,
        job_ids: Iterable[str] = (),
        *,
        all: bool = False,
        job_type: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Run dead jobs again (these ids, or ``all`` matching the filters); returns how many."""
        return self._send(calls.requeue_dead(job_ids, all, job_type, reason))

    def purge_dead(self, *, job_type: str | None = None, reason: str | None = None) -> int:
        """Delete the dead jobs matching the filters; returns how many."""
        return self._send(calls.purge_dead(job_type, reason))

    def prune_jobs(
        self,
        older_than_s: int,
        *,
        job_type: str | None = None,
        statuses: Sequence[str] = (),
        dry_run: bool = False,
        limit: int = 0,
    ) -> tuple[int, bool]:
        """Delete finished jobs (succeeded, cancelled, dead; ``statuses`` narrows) that finished at
        least ``older_than_s`` ago, at most ``limit`` rows (0: the server's 100,000). Returns the rows
        deleted (counted, with dry_run) and whether more may be left (call again)."""
        return self._send(calls.prune_jobs(older_than_s, job_type, statuses, dry_run, limit))

    # -- search and bulk actions ---------------------------------------------------------

    def list_jobs(
        self,
        job_filter: JobFilter | None = None,
        *,
        limit: int = 50,
        cursor: str = "",
        oldest_first: bool = False,
        max_payload_bytes: int = 0,
        with_total: bool = False,
    ) -> JobPage:
        """One page of the jobs ``job_filter`` selects (every job without one), newest first unless
        ``oldest_first``: by creation, or with a finished-time range by finish time. ``limit``:
        the page size, at most 500. ``cursor``: the previous page's ``next_cursor`` (same filter
        and order), for the next page; pages stay stable while jobs are added.
        ``max_payload_bytes``: payload and result bytes returned per job (0: 1024; at most 65536;
        ``JobInfo.truncated`` says when one was cut). ``with_total``: count the matches too (exact
        when cheap, else an estimate: ``JobPage.total_exact``). A token scoped to some job types
        sees only their jobs."""
        return self._send(
            calls.list_jobs(job_filter, limit, cursor, oldest_first, max_payload_bytes, with_total)
        )

    def bulk_jobs(
        self,
        action: str,
        job_filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        limit: int = 0,
        after_id: str = "",
    ) -> BulkResult:
        """Apply ``action`` (one of "cancel", "requeue", "run_now", "delete") to the jobs
        ``job_filter`` selects among those it applies to: cancel delayed, ready, leased and waiting jobs;
        requeue dead ones; run delayed ones (a future run or a retry's backoff) now; delete
        succeeded, cancelled and dead ones. Jobs are taken oldest first, at most ``limit`` a call
        (0: 10,000; at most 100,000): when ``BulkResult.more``, call again with
        ``after_id=result.last_id`` for the rest. ``dry_run`` counts and changes nothing. Admin
        only."""
        return self._send(calls.bulk_jobs(action, job_filter, dry_run, limit, after_id))

    # -- the cluster -----------------------------------------------------------------------

    def version(self) -> VersionInfo:
        """The dispatcher's release, protocol version and shard count."""
        return self._send(calls.version())

    def shard_map(self) -> ShardMap:
        """Which dispatcher owns which shard (any dispatcher answers)."""
        return self._send(calls.shard_map())

    def rebalance(self, *, dry_run: bool = False) -> RebalancePlan:
        """Balance the shards over the live dispatchers; with dry_run, only return the plan."""
        return self._send(calls.rebalance(dry_run))

    # -- schedules ---------------------------------------------------------------------

    def upsert_schedule(self, schedule: Schedule | None = None, **fields: Any) -> tuple[ScheduleInfo, bool]:
        """Create or replace a schedule by name (a Schedule, or its fields as keywords). Returns it
        and whether anything changed: declaring the same schedule again does nothing."""
        return self._send(calls.upsert_schedule(schedule, fields))

    def get_schedule(self, name: str) -> ScheduleInfo:
        return self._send(calls.get_schedule(name))

    def schedules(self, job_type: str = "") -> list[ScheduleInfo]:
        """Every schedule, or those of one job type."""
        return self._send(calls.schedules(job_type))

    def pause_schedule(self, name: str) -> ScheduleInfo:
        """No occurrence runs until it is resumed."""
        return self._send(calls.pause_schedule(name))

    def resume_schedule(self, name: str) -> ScheduleInfo:
        """It runs again from now on (the occurrences missed while paused do not run)."""
        return self._send(calls.resume_schedule(name))

    def delete_schedule(self, name: str) -> None:
        self._send(calls.delete_schedule(name))

    def next_occurrences(self, name: str, count: int = 5) -> tuple[list[int], str]:
        """The coming occurrences (epoch ms) and the schedule's time zone."""
        return self._send(calls.next_occurrences(name, count))

    # -- flow control ------------------------------------------------------------------

    def set_queue_settings(
        self, job_type: str, settings: QueueSettings | None = None, **changes: Any
    ) -> QueueInfo:
        """Set a job type's flow control: whole ``settings`` (what it leaves out goes back to the
        defaults), or only the fields given as keywords (``concurrency=5``, ``rate=(100, 20)``,
        ``paused=("low",)``; the others keep their values). Any valid type may be given settings
        before it has jobs. InvalidArgumentError names a bad field; nothing is changed then."""
        return self._send(calls.set_queue_settings(job_type, settings, changes))

    def get_queue(self, job_type: str) -> QueueInfo:
        """A type's settings (the defaults when none were set) and its live figures."""
        return self._send(calls.get_queue(job_type))

    def list_queues(self) -> list[QueueInfo]:
        """Every type with settings or with jobs now."""
        return self._send(calls.list_queues())

    def pause_queue(self, job_type: str, priority: str | None = None) -> QueueInfo:
        """Start no more jobs of the type (of one priority class when given); running jobs finish,
        delayed ones still become ready. It holds across restarts and Redis data loss."""
        return self._send(calls.pause_queue(job_type, priority))

    def resume_queue(self, job_type: str, priority: str | None = None) -> QueueInfo:
        """Undo pause_queue (for one class when given; every class otherwise)."""
        return self._send(calls.resume_queue(job_type, priority))

    def close(self) -> None:
        with self._owner_lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        for channel in self._owner_channels:
            channel.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_ClientOptions):
    """asyncio client with the same methods and options as :class:`Client`, awaited.

    Concurrent ``enqueue`` calls share round trips (see ``_pipelining``).
    """

    def _open(self) -> None:
        self._channel = self._new_channel(self.target)
        self._stubs = _stubs(self._channel)
        self._pipeline = EnqueuePipeline(self._enqueue_one, self._enqueue_specs)
        self._map_read: asyncio.Future[None] | None = None
        self._streams: dict[str, AsyncEnqueueStream] = {}  # address -> its single enqueues' stream
        self._unary_only: set[str] = set()  # addresses of dispatchers without EnqueueStream

    # -- sending a call ------------------------------------------------------------------

    async def _send(self, call: Call[T]) -> T:
        address = self.target if call.job_types is None else await self._address_of(call.job_types)
        return await self._send_to(address, call)

    async def _send_to(self, address: str, call: Call[T]) -> T:
        try:
            reply = await self._rpc_at(address, call)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return call.result(reply)

    async def _rpc(self, stubs: dict[str, Any], call: Call[Any], timeout: float | None = None) -> Any:
        method = getattr(stubs[call.service], call.method)
        timeout = self.timeout if timeout is None else timeout
        return await method(call.request, timeout=timeout, metadata=self._metadata)

    async def _rpc_at(self, address: str, call: Call[Any]) -> Any:
        if address == self.target or self._routes is None:
            return await self._rpc(self._stubs, call)
        try:
            return await self._rpc(self._owner_stubs_of(address), call)
        except grpc.aio.AioRpcError as exc:
            if self._routes.failed(address, exc):
                return await self._rpc(self._stubs, call)
            raise

    def _new_channel(self, address: str) -> grpc.aio.Channel:
        return self.security.aio_channel(address, options=CHANNEL_OPTIONS)

    async def _address_of(self, job_types: Iterable[str]) -> str:
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
        view: ShardMap | None
        try:
            reply = await self._rpc(self._stubs, calls.shard_map(), timeout=min(self.timeout, 5.0))
            view = ShardMap.from_pb(reply)
        except grpc.RpcError:
            view = None  # the target takes every job until the next try
        self._routes.update(view)
        if view is not None:
            for address in self._routes.retired(list(self._owner_stubs), self.timeout + RETIRE_SLACK_S):
                if (stream := self._streams.pop(address, None)) is not None:
                    await stream.close()
                del self._owner_stubs[address]
                self._owner_channels.remove(channel := self._owner_channel_of.pop(address))
                await channel.close()

    # What the pipeline sends: one job, or a batch, to one dispatcher.
    async def _enqueue_one(self, spec: pb.JobSpec, address: str) -> str:
        """One job on its address's EnqueueStream (see ``_enqueue_stream`` for its failures)."""
        attempts = Attempts(address, self.target, self._routes)
        while address not in self._unary_only:
            stream = self._stream_at(address)
            outcome = await stream.send(spec, self.timeout)
            if not isinstance(outcome, pb.EnqueueStreamResponse) and self._streams.get(address) is stream:
                del self._streams[address]
            step = attempts.settle(outcome)
            if isinstance(step, str):
                return step
            address = step.address
            if step.unary:
                self._unary_only.add(address)
        return await self._send_to(address, calls.enqueue(spec))

    def _stream_at(self, address: str) -> AsyncEnqueueStream:
        stream = self._streams.get(address)
        if stream is None:
            stream = self._streams[address] = AsyncEnqueueStream(self._stream_method(address), self._metadata)
        return stream

    async def _enqueue_specs(self, specs: list[pb.JobSpec], address: str) -> list[str]:
        return await self._send_to(address, calls.enqueue_many(specs))

    # -- jobs ------------------------------------------------------------------------------

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        priority: str = "default",
        run_at: datetime | float | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int | None = None,
        lease_ttl: float | timedelta | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        depends_on: Iterable[str | tuple[str, str]] | None = None,
        on_failure: str = "fail",
    ) -> str:
        """Enqueue one job; returns its id once it is committed (options as for ``Client.enqueue``).
        Calls made concurrently (in the same turn of the event loop) to the same dispatcher share
        one round trip; each still gets its own id or error."""
        spec = job_spec(
            job_type, payload, priority=priority, run_at=run_at, delay=delay, max_attempts=max_attempts,
            lease_ttl=lease_ttl, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
            headers=headers, depends_on=depends_on, on_failure=on_failure,
        )  # fmt: skip
        with _tracing.sending([spec]) as span:
            job_id = await self._pipeline.enqueue(spec, await self._address_of((spec.type,)))
            _tracing.sent(span, [job_id])
        return job_id

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[str]:
        """One call and one transaction: to the shards' owner when the jobs share one, else to the
        target (which hands each shard's jobs to its owner)."""
        specs = calls.specs(jobs)
        with _tracing.sending(specs) as span:
            job_ids = await self._send(calls.enqueue_many(specs))
            _tracing.sent(span, job_ids)
        return job_ids

    async def enqueue_batch(self, batch: Batch, jobs: Iterable[Mapping[str, Any]]) -> OpenBatch:
        """As ``Client.enqueue_batch``."""
        return batch.opened(await self.enqueue_many(batch.specs(jobs)))

    async def add_to_batch(self, batch: OpenBatch | str, jobs: Iterable[Mapping[str, Any]]) -> list[str]:
        """As ``Client.add_to_batch``."""
        opened = OpenBatch.from_token(batch) if isinstance(batch, str) else batch
        return await self.enqueue_many(opened.add_specs(jobs))

    async def get_job(self, job_id: str) -> JobInfo:
        return await self._send(calls.get_job(job_id))

    async def watch(self, job_id: str, *, timeout: float | None = None) -> AsyncIterator[JobInfo]:
        """As :meth:`Client.watch`, iterated with ``async for``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = waiting.FIRST_RETRY_S
        request = pb.WatchJobRequest(job_id=job_id)
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise waiting.timed_out(job_id, timeout)
            stream = self._stubs[calls.JOBS].WatchJob(request, timeout=remaining, metadata=self._metadata)
            try:
                async for event in stream:
                    delay = waiting.FIRST_RETRY_S
                    yield JobInfo.from_pb(event.job)
                    if event.final:
                        return
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise waiting.timed_out(job_id, timeout) from None
                if exc.code() not in waiting.RESUMABLE:
                    raise from_rpc_error(exc) from None
            finally:
                stream.cancel()
            await asyncio.sleep(delay if deadline is None else max(0.0, min(delay, deadline - loop.time())))
            delay = waiting.next_retry(delay)

    async def wait(
        self, job_id: str, *, timeout: float | None = None, on_progress: Callable[[Any], None] | None = None
    ) -> Any:
        """As :meth:`Client.wait`."""
        job: JobInfo | None = None
        reported: Any = None
        async for job in self.watch(job_id, timeout=timeout):
            if on_progress is not None and job.progress is not None and job.progress != reported:
                reported = job.progress
                on_progress(job.progress)
        assert job is not None  # watch yields at least the final state
        return waiting.outcome(job)

    async def cancel(self, job_id: str) -> str:
        return await self._send(calls.cancel(job_id))

    async def stats(self) -> list[QueueStats]:
        return await self._send(calls.stats())

    async def stats_snapshot(self, *, counters_only: bool = False) -> StatsSnapshot:
        return await self._send(calls.stats_snapshot(counters_only))

    async def whoami(self) -> Identity:
        return await self._send(calls.whoami())

    async def workers(self) -> list[WorkerInfo]:
        return await self._send(calls.workers())

    async def dead_letters(
        self, *, job_type: str | None = None, reason: str | None = None, limit: int = 100, after_id: str = ""
    ) -> list[JobInfo]:
        return await self._send(calls.dead_letters(job_type, reason, limit, after_id))

    async def requeue_dead(
        self,
        job_ids: Iterable[str] = (),
        *,
        all: bool = False,
        job_type: str | None = None,
        reason: str | None = None,
    ) -> int:
        return await self._send(calls.requeue_dead(job_ids, all, job_type, reason))

    async def purge_dead(self, *, job_type: str | None = None, reason: str | None = None) -> int:
        return await self._send(calls.purge_dead(job_type, reason))

    async def prune_jobs(
        self,
        older_than_s: int,
        *,
        job_type: str | None = None,
        statuses: Sequence[str] = (),
        dry_run: bool = False,
        limit: int = 0,
    ) -> tuple[int, bool]:
        return await self._send(calls.prune_jobs(older_than_s, job_type, statuses, dry_run, limit))

    # -- search and bulk actions ---------------------------------------------------------

    async def list_jobs(
        self,
        job_filter: JobFilter | None = None,
        *,
        limit: int = 50,
        cursor: str = "",
        oldest_first: bool = False,
        max_payload_bytes: int = 0,
        with_total: bool = False,
    ) -> JobPage:
        return await self._send(
            calls.list_jobs(job_filter, limit, cursor, oldest_first, max_payload_bytes, with_total)
        )

    async def bulk_jobs(
        self,
        action: str,
        job_filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        limit: int = 0,
        after_id: str = "",
    ) -> BulkResult:
        return await self._send(calls.bulk_jobs(action, job_filter, dry_run, limit, after_id))

    # -- the cluster -----------------------------------------------------------------------

    async def version(self) -> VersionInfo:
        return await self._send(calls.version())

    async def shard_map(self) -> ShardMap:
        return await self._send(calls.shard_map())

    async def rebalance(self, *, dry_run: bool = False) -> RebalancePlan:
        return await self._send(calls.rebalance(dry_run))

    # -- schedules ---------------------------------------------------------------------

    async def upsert_schedule(
        self, schedule: Schedule | None = None, **fields: Any
    ) -> tuple[ScheduleInfo, bool]:
        return await self._send(calls.upsert_schedule(schedule, fields))

    async def get_schedule(self, name: str) -> ScheduleInfo:
        return await self._send(calls.get_schedule(name))

    async def schedules(self, job_type: str = "") -> list[ScheduleInfo]:
        return await self._send(calls.schedules(job_type))

    async def pause_schedule(self, name: str) -> ScheduleInfo:
        return await self._send(calls.pause_schedule(name))

    async def resume_schedule(self, name: str) -> ScheduleInfo:
        return await self._send(calls.resume_schedule(name))

    async def delete_schedule(self, name: str) -> None:
        await self._send(calls.delete_schedule(name))

    async def next_occurrences(self, name: str, count: int = 5) -> tuple[list[int], str]:
        return await self._send(calls.next_occurrences(name, count))

    # -- flow control ------------------------------------------------------------------

    async def set_queue_settings(
        self, job_type: str, settings: QueueSettings | None = None, **changes: Any
    ) -> QueueInfo:
        return await self._send(calls.set_queue_settings(job_type, settings, changes))

    async def get_queue(self, job_type: str) -> QueueInfo:
        return await self._send(calls.get_queue(job_type))

    async def list_queues(self) -> list[QueueInfo]:
        return await self._send(calls.list_queues())

    async def pause_queue(self, job_type: str, priority: str | None = None) -> QueueInfo:
        return await self._send(calls.pause_queue(job_type, priority))

    async def resume_queue(self, job_type: str, priority: str | None = None) -> QueueInfo:
        return await self._send(calls.resume_queue(job_type, priority))

    async def close(self) -> None:
        if self._map_read is not None:
            self._map_read.cancel()
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
        for channel in self._owner_channels:
            await channel.close()
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# help() and IDEs that read __doc__ show the blocking client's documentation on the async twin.
for _name, _method in vars(AsyncClient).items():
    if not _name.startswith("_") and callable(_method) and _method.__doc__ is None:
        _method.__doc__ = getattr(Client, _name).__doc__

"""Run one dispatcher process: Redis (or a private one), the store, the gRPC server, signals."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shardq_common.errors import ConfigError, StoreUnavailable
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.redaction import redact

from .api.job_service import JobService
from .api.queue_service import QueueService
from .api.schedule_service import ScheduleService
from .api.security import ServerSecurity
from .api.shard_service import ShardService
from .api.worker_service import WorkerService
from .app import Dispatcher
from .cluster.state_metrics import serve_metrics
from .config import Settings
from .ops import metrics, redis_client
from .ops.embedded import EmbeddedRedis
from .ops.redis_errors import REDIS_DOWN
from .ops.task_dump import dump_tasks
from .store import open_store

log = structlog.get_logger("shardq.server")
# What this process sends: a batch of leases (SHARDQ_LEASE_BATCH jobs) with the largest payloads fits.
# What it accepts is SHARDQ_MAX_REQUEST_BYTES.
MAX_SEND_BYTES = 256 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class RunningDispatcher:
    """A started dispatcher with its server; ``port`` is the bound gRPC port."""

    def __init__(
        self,
        app: Dispatcher,
        server: grpc.aio.Server,
        port: int,
        health: health.aio.HealthServicer,
        stack: AsyncExitStack,
    ) -> None:
        self.app, self.server, self.port, self.health, self._stack = app, server, port, health, stack

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.app.stop()
        await self.server.stop(grace)
        await self._stack.aclose()


async def start_dispatcher(settings: Settings) -> RunningDispatcher:
    # First: a missing certificate or a malformed tokens file stops the start before anything runs.
    security = ServerSecurity.from_settings(settings)
    stack = AsyncExitStack()
    try:
        redis_url = settings.redis_url
        if not redis_url:
            embedded = EmbeddedRedis()
            await embedded.start()
            stack.callback(embedded.stop)
            redis_url = embedded.url
        else:
            log.info("using redis", url=redact(redis_url))
        try:
            store = await open_store(settings.resolved_db_url())
        except StoreUnavailable as exc:
            raise ConfigError(
                f"{exc} (check SHARDQ_DB_URL or --db-url, and that the database is up)"
            ) from None
        stack.push_async_callback(store.close)
        log.info("using database", url=store.url_for_logs, embedded=settings.db_url is None)
        # SO_REUSEPORT only when a supervisor runs several processes on one shared address.
        options = [
            *GRPC_OPTIONS,
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            ("grpc.so_reuseport", 1 if settings.shared_listen else 0),
        ]
        server = grpc.aio.server(options=options, interceptors=security.interceptors())
        stack.push_async_callback(server.stop, None)  # a failed start leaves no server behind
        port = security.bind(server, settings.listen)
        if port == 0:
            raise ConfigError(
                f"cannot listen on {settings.listen}: the port is taken or the address is not this "
                "host's (set SHARDQ_LISTEN or --listen)"
            )
        advertise = settings.advertised(port)
        own_port = int(advertise.rsplit(":", 1)[1])
        if own_port != port:  # a private address of this process, next to the shared one
            host = settings.listen.rsplit(":", 1)[0]
            if security.bind(server, f"{host}:{own_port}") == 0:
                raise ConfigError(
                    f"cannot listen on {host}:{own_port}, the advertised port (SHARDQ_ADVERTISE)"
                )
        if settings.metrics_listen:  # before the dispatcher starts: a taken port stops nothing running
            serve_metrics(settings.metrics_listen, redis_url, settings.shard_count)
            log.info("metrics", address=settings.metrics_listen)
        # One server, or a Redis Cluster; connections named after this member.
        redis: Any = redis_client.connect(redis_url, client_name=settings.member_id(advertise))
        stack.push_async_callback(redis.aclose)
        app = Dispatcher(settings, redis, store, advertise, security.peers)
        try:
            await app.start()
        except REDIS_DOWN as exc:
            raise ConfigError(
                f"cannot reach Redis at {redact(redis_url)}: {exc} (check SHARDQ_REDIS_URL or --redis-url)"
            ) from None
        stack.push_async_callback(_stop_unless_stopped, app)
        _add_services(server, app)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await server.start()
        if settings.health_listen:
            await _serve_plain_health(settings, health_servicer, stack)
        if security.tokens is not None and not settings.peer_token:
            log.warning(
                "auth is on but SHARDQ_PEER_TOKEN is unset: other dispatchers will refuse this one's "
                "hand-offs (their shards are then reconciled from the database, later)"
            )
        health_task = asyncio.create_task(_health_loop(app, health_servicer), name="health")
        stack.push_async_callback(_cancel, health_task)
        log.info("listening", address=settings.listen, port=port, advertise=advertise, **security.describe())
        return RunningDispatcher(app, server, port, health_servicer, stack)
    except BaseException:
        await stack.aclose()
        raise


def _add_services(server: grpc.aio.Server, app: Dispatcher) -> None:
    """The gRPC services, each given the parts of the dispatcher it serves from."""
    jobs = JobService(
        app.settings,
        app.store,
        app.working_set,
        app.writer,
        app.ingest,
        app.canceller,
        app.ownership,
        app.loops,
        app.watches,
        app.enqueue_streams,
        app.dispatcher_id,
    )
    workers = WorkerService(app.dispatcher_id, app.session_context, app.transitions, app.returns)
    shards = ShardService(
        app.settings, app.redis, app.coordinator, app.working_set, app.ownership, app.ingest
    )
    schedules = ScheduleService(app.store, app.scheduler)
    queues = QueueService(app.flow, app.working_set, app.settings.shard_count)
    pb_grpc.add_JobServiceServicer_to_server(jobs, server)
    pb_grpc.add_WorkerServiceServicer_to_server(workers, server)
    pb_grpc.add_ShardServiceServicer_to_server(shards, server)
    pb_grpc.add_ScheduleServiceServicer_to_server(schedules, server)
    pb_grpc.add_QueueServiceServicer_to_server(queues, server)


async def _stop_unless_stopped(app: Dispatcher) -> None:
    """A start that failed after the dispatcher started (the health port taken) stops it again."""
    if not app.stopping:
        await app.stop()


async def _serve_plain_health(
    settings: Settings, servicer: health.aio.HealthServicer, stack: AsyncExitStack
) -> None:
    """grpc.health.v1 alone on a plaintext port: it tells SERVING or NOT_SERVING and nothing else."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if settings.shared_listen else 0)])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:
        port = server.add_insecure_port(settings.health_listen)
    except RuntimeError:  # grpcio raises where older releases returned 0
        port = 0
    if port == 0:
        raise ConfigError(
            f"cannot listen on {settings.health_listen}: the port is taken (SHARDQ_HEALTH_LISTEN)"
        )
    await server.start()
    stack.push_async_callback(server.stop, 1.0)
    log.info("plaintext health endpoint", address=settings.health_listen)


async def _health_loop(app: Dispatcher, servicer: health.aio.HealthServicer, every_s: float = 2.0) -> None:
    """grpc.health.v1: SERVING while Redis and the DB answer and this process is a member that owns
    or can take shards; NOT_SERVING otherwise, and from the start of a shutdown."""
    serving: bool | None = None
    rounds = 0
    while not app.stopping:
        # Each checked on its own, so shardq_dependency_up tells which one is down.
        redis_error, db_error = await asyncio.gather(
            _ping(app.redis.ping, every_s), _ping(app.store.ping, every_s)
        )
        errors = {"redis": redis_error, "database": db_error}
        for dependency, error in errors.items():
            metrics.DEPENDENCY_UP.labels(dependency).set(0 if error else 1)
        ok = not any(errors.values())
        if not ok and serving is not False:
            log.warning("not healthy", **{k: v for k, v in errors.items() if v})
        if ok != serving:
            status = (
                health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for service in (
                "",
                "shardq.v1.JobService",
                "shardq.v1.WorkerService",
                "shardq.v1.ScheduleService",
                "shardq.v1.QueueService",
            ):
                await servicer.set(service, status)
            serving = ok
        if ok and rounds % 3 == 0:  # the dead-letter depth from the DB, every ~6 s
            try:
                metrics.set_dead_depth(await app.store.dead_counts())
                metrics.WAITING_DEPTH.set(await app.store.count_waiting())
            except Exception as exc:
                log.debug("dead-letter depth not read", error=str(exc))
        rounds += 1
        sessions = app.sessions.all()
        metrics.WORKERS.set(len(sessions))
        metrics.FREE_CREDIT.set(sum(s.credit for s in sessions))
        metrics.IN_FLIGHT.set(sum(len(s.held) for s in sessions))
        await asyncio.sleep(every_s)


async def _ping(ping: Callable[[], Awaitable[Any]], timeout_s: float) -> str | None:
    """None when the dependency answered within timeout_s, else the error."""
    try:
        async with asyncio.timeout(timeout_s):
            await ping()
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _exit_when_orphaned(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - nothing signals a reparenting; poll it
        await asyncio.sleep(1.0)
    log.warning("the supervisor is gone; shutting down")
    stop.set()


async def run_until_signalled(settings: Settings) -> None:
    running = await start_dispatcher(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    # Supervised: do not outlive the supervisor.
    watchdog = asyncio.create_task(_exit_when_orphaned(stop)) if settings.shared_listen else None
    await stop.wait()
    log.info("shutting down")
    if watchdog is not None:
        watchdog.cancel()
    await running.stop()

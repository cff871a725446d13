"""Serving the dashboard with uvicorn: on its own (``dispatcher dashboard``) or beside a dispatcher
in the same event loop (``SHARDQ_DASHBOARD_LISTEN``, ``dispatcher demo --dashboard``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import grpc
import structlog
import uvicorn

from shardq_common.errors import ConfigError
from worker_sdk import ShardqError

from .app import build_app
from .gateway import Gateway
from .settings import DashboardSettings, host_port, is_loopback

log = structlog.get_logger("shardq.dashboard")
#: How long the start waits for the dispatcher to say whether it checks tokens.
PROBE_S = 10.0
#: Connections and requests served at once; beyond, uvicorn answers 503 (live streams have their
#: own, smaller cap: web.MAX_STREAMS).
MAX_CONCURRENCY = 256


class _Server(uvicorn.Server):
    """A uvicorn server that leaves the process's signals alone: its owner stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def check_exposure(settings: DashboardSettings, gateway: Gateway) -> bool | None:
    """Whether the dispatcher checks tokens (None: it did not answer within PROBE_S). A dashboard
    that would serve a non-loopback address in front of a dispatcher that checks none refuses to
    start, unless allow_open: anyone reaching the port would act as admin. So does one in front of a
    dispatcher that did not answer: it cannot tell."""
    client = gateway.client("")
    deadline = asyncio.get_running_loop().time() + PROBE_S
    auth: bool | None = None
    while auth is None:
        try:
            auth = (await client.whoami()).auth
        except ShardqError as exc:
            if exc.code == grpc.StatusCode.UNAUTHENTICATED:
                auth = True  # refused without a token: the dispatcher checks tokens
                break
            gateway.reset()  # a new channel for the next try, not one waiting out its backoff
            if asyncio.get_running_loop().time() >= deadline:
                log.warning("dispatcher not answering yet; the dashboard starts anyway", error=str(exc))
                break
            await asyncio.sleep(0.5)
            client = gateway.client("")
    host, _ = host_port(settings.listen)
    if auth is not True and not is_loopback(host) and not settings.allow_open:
        why = "checks no tokens" if auth is False else "did not say whether it checks tokens"
        raise ConfigError(
            f"the dispatcher {why}, so the dashboard serves loopback only; "
            f"refusing {settings.listen} (turn auth on, listen on 127.0.0.1, "
            "or pass --allow-open / SHARDQ_DASHBOARD_ALLOW_OPEN=1)"
        )
    return auth


class RunningDashboard:
    def __init__(self, server: _Server, task: asyncio.Task[None], url: str) -> None:
        self.server = server
        self.task = task
        self.url = url

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def start_dashboard(settings: DashboardSettings) -> RunningDashboard:
    """Start serving; returns once the port is bound (its URL names the port actually bound)."""
    gateway = Gateway(settings.target)
    await check_exposure(settings, gateway)
    host, port = host_port(settings.listen)
    app = build_app(settings, gateway)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        lifespan="on",
        limit_concurrency=MAX_CONCURRENCY,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the bind failed: its error
            raise ConfigError(f"the dashboard could not listen on {settings.listen}")
        await asyncio.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
    scheme = "https" if settings.tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{bound}/"
    log.info("dashboard serving", url=url, target=settings.target)
    return RunningDashboard(server, task, url)

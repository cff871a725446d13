"""``dispatcher dashboard``, and the dashboard served beside a dispatcher (SHARDQ_DASHBOARD_LISTEN)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from shardq_common.errors import ConfigError
from shardq_common.logs import configure

T = TypeVar("T")


def run_dashboard(
    *, listen: str | None, target: str | None, allow_open: bool | None, allowed_hosts: str | None = None
) -> int:
    import uvloop

    from ..dashboard.serve import start_dashboard
    from ..dashboard.settings import DashboardSettings, host_list

    configure("info", "console")
    try:
        settings = DashboardSettings.from_env(
            listen=listen,
            target=target,
            allow_open=allow_open,
            allowed_hosts=host_list(allowed_hosts) if allowed_hosts else None,
        )
    except ConfigError as exc:
        print(f"dispatcher dashboard: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        try:
            running = await start_dashboard(settings)
        except (ConfigError, OSError) as exc:
            print(f"dispatcher dashboard: {exc}", file=sys.stderr)
            return 2
        print(f"dashboard: {running.url} (dispatcher {settings.target or 'from SHARDQ_TARGET'})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await asyncio.wait(
            [asyncio.ensure_future(stop.wait()), running.task], return_when=asyncio.FIRST_COMPLETED
        )
        await running.stop()
        return 0

    return int(uvloop.run(serve()))


async def with_dashboard(dispatcher: Coroutine[Any, Any, T], dispatcher_listen: str) -> T:
    """Run a dispatcher or a supervisor (until its signal) and the dashboard at
    SHARDQ_DASHBOARD_LISTEN beside it, calling it at its own address; the dispatcher's result."""
    from ..dashboard.serve import start_dashboard
    from ..dashboard.settings import DashboardSettings

    host, _, port = dispatcher_listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    settings = DashboardSettings.from_env(target=f"{host}:{port}")
    main = asyncio.ensure_future(dispatcher)
    running = None
    try:
        running = await start_dashboard(settings)
        return await main
    finally:
        if running is not None:
            await running.stop()
        if not main.done():
            main.cancel()

"""The Starlette application: the pages, the JSON API and the static files."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import api, pages
from .gateway import Gateway
from .settings import DashboardSettings
from .web import SECURITY_HEADERS, Dashboard

STATIC = Path(__file__).parent / "static"


class SecurityHeaders:
    """Every answer, static files included, carries the CSP and the other security headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, sending)


async def healthz(request: Request) -> Response:
    """Liveness for probes: the HTTP server answers (it calls no dispatcher and needs no session)."""
    return PlainTextResponse("ok")


def build_app(settings: DashboardSettings, gateway: Gateway | None = None) -> Starlette:
    dashboard = Dashboard(settings, gateway)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await dashboard.gateway.close()

    app = Starlette(
        routes=[
            *pages.routes(),
            *api.routes(),
            Route("/healthz", healthz),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(SecurityHeaders)
    app.state.dashboard = dashboard
    return app

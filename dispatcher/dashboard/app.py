"""The Starlette application: the pages, the JSON API and the static files."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
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


class SameOriginWrites:
    """A request that may change something (any method but GET, HEAD, OPTIONS) is refused when the
    browser says it comes from another site: its Origin names another host, or Sec-Fetch-Site is
    neither same-origin nor none. Scripts send neither header and are not affected."""

    SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in self.SAFE:
            headers = Headers(scope=scope)
            origin, site = headers.get("origin"), headers.get("sec-fetch-site")
            host = headers.get("host", "").lower()
            foreign_origin = origin is not None and urlsplit(origin).netloc.lower() != host
            if foreign_origin or (site is not None and site not in ("same-origin", "none")):
                refused = JSONResponse({"error": "refused: the request came from another site"}, 403)
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
    app.add_middleware(SameOriginWrites)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts(), www_redirect=False)
    app.add_middleware(SecurityHeaders)
    app.state.dashboard = dashboard
    return app

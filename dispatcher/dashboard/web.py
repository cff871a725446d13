"""Requests in and answers out: sessions and sign-in, CSRF, security headers, errors shown in place.

Every route is one of three kinds. A *page* renders a template; when it has no session it redirects
to the sign-in page, and an operation that fails shows its message inside the page. An *api* route
answers JSON (errors as ``{"error": message}`` with a 4xx/5xx status). An *action* changes something:
it needs a CSRF token (a browser session) or a bearer token (a script), and it answers JSON, or an HTML
fragment with the outcome when htmx sent it, so a failed action shows its message in place.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import grpc
import structlog
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Scope, Send

from worker_sdk import ShardqError

from .errors import HTTPProblem, problem_of
from .gateway import Gateway
from .operations import Operations
from .sessions import COOKIE, Sealer, Session, same_token
from .settings import DashboardSettings, host_port, is_loopback

log = structlog.get_logger("shardq.dashboard")
TEMPLATES = Path(__file__).parent / "templates"
#: Request bodies (forms, JSON) bigger than this are refused before they are read.
MAX_BODY_BYTES = 64 * 1024
MAX_FIELDS = 50
#: How long the answer to "does the dispatcher check tokens?" and a bearer token's identity are kept.
AUTH_PROBE_S = 5.0
BEARER_CACHE_S = 30.0
MAX_BEARERS = 256
#: Tokens the dispatcher refused, per remote address, before it is answered 429 for a while.
MAX_REFUSED_TOKENS = 10
REFUSED_WINDOW_S = 60.0
MAX_ADDRESSES_TRACKED = 4096
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
ANONYMOUS = "anonymous"
#: Live streams (server-sent events) open at once: per session, and in all.
MAX_STREAMS_PER_SESSION = 4
MAX_STREAMS = 64

Kind = Literal["page", "api", "action"]


@dataclass
class Call:
    """What a route handler gets: the request, the caller's session and the request's inputs."""

    request: Request
    session: Session
    inputs: dict[str, str]

    def get(self, name: str, default: str = "") -> str:
        return self.inputs.get(name, default)


class Dashboard:
    def __init__(self, settings: DashboardSettings, gateway: Gateway | None = None) -> None:
        self.settings = settings
        self.sealer = Sealer(settings.session_key())
        self.gateway = gateway or Gateway(settings.target)
        self.ops = Operations(self.gateway)
        self.templates = Jinja2Templates(directory=str(TEMPLATES))
        self.templates.env.filters["when"] = when
        self.serves_loopback = is_loopback(host_port(settings.listen)[0])
        self._auth_probe: tuple[float, bool] = (0.0, True)
        self._bearers: OrderedDict[bytes, tuple[float, Session]] = OrderedDict()
        self._refused: OrderedDict[str, list[float]] = OrderedDict()
        self._streams: dict[str, int] = {}

    # -- who is calling -------------------------------------------------------------------------

    async def auth_on(self) -> bool:
        """Whether the dispatcher checks tokens (asked without one; kept AUTH_PROBE_S)."""
        at, on = self._auth_probe
        now = time.monotonic()
        if now - at >= AUTH_PROBE_S:
            try:
                on = bool((await self.ops.identity(""))["auth"])
            except ShardqError as exc:
                if exc.code != grpc.StatusCode.UNAUTHENTICATED:
                    raise
                on = True  # a call without a token refused: the dispatcher checks tokens
            self._auth_probe = (now, on)
        return on

    async def session_of(self, request: Request, kind: Kind) -> tuple[Session | None, bool]:
        """(the caller's session or None, whether it is new and goes into a cookie)."""
        auth = await self.auth_on()
        # Before any way in, bearer tokens included: without auth any token would be let through.
        if not auth and not self.serves_loopback and not self.settings.allow_open:
            raise HTTPProblem(
                403,
                "the dispatcher checks no tokens, so this dashboard answers on loopback only "
                "(turn auth on, or start it with --allow-open)",
            )
        authorization = request.headers.get("authorization", "")
        if kind != "page" and authorization.lower().startswith("bearer "):
            return await self._bearer(request, authorization[7:].strip()), False
        session = self.sealer.open(request.cookies.get(COOKIE))
        if auth:
            return (session if session is not None and session.signed_in and session.token else None), False
        if session is not None and session.signed_in and not session.token:
            return session, False
        return self.new_session("", {"name": ANONYMOUS, "role": "admin", "types": ()}), True

    async def _bearer(self, request: Request, token: str) -> Session:
        if not token:
            raise HTTPProblem(401, "Authorization: Bearer needs a token")
        key = hashlib.sha256(token.encode()).digest()
        cached = self._bearers.get(key)
        if cached is not None and time.monotonic() - cached[0] < BEARER_CACHE_S:
            return cached[1]
        who = await self.checked_identity(request, token, "bearer token")
        session = self.new_session(token, who)
        self._bearers[key] = (time.monotonic(), session)
        while len(self._bearers) > MAX_BEARERS:
            self._bearers.popitem(last=False)
        return session

    async def checked_identity(self, request: Request, token: str, how: str) -> dict[str, Any]:
        """Who a token not seen before stands for; an address whose tokens were refused
        MAX_REFUSED_TOKENS times within REFUSED_WINDOW_S is answered 429 until the window passes."""
        address = remote_address(request)
        now = time.monotonic()
        refused = [at for at in self._refused.get(address, []) if now - at < REFUSED_WINDOW_S]
        if len(refused) >= MAX_REFUSED_TOKENS:
            raise HTTPProblem(429, "too many unknown tokens from this address: wait a minute")
        try:
            return await self.ops.identity(token)
        except ShardqError as exc:
            if exc.code != grpc.StatusCode.UNAUTHENTICATED:
                raise
            self._refused[address] = [*refused, now]
            self._refused.move_to_end(address)
            while len(self._refused) > MAX_ADDRESSES_TRACKED:
                self._refused.popitem(last=False)
            log.warning("dashboard token refused", how=how, remote=address)
            raise

    def new_session(self, token: str, who: dict[str, Any]) -> Session:
        return Session(
            token=token,
            name=str(who["name"]),
            role=str(who["role"]),
            types=tuple(who["types"]),
            expires=time.time() + self.settings.session_s,
        )

    def pre_session(self) -> Session:
        """A session that is no sign-in, to carry the sign-in form's CSRF token."""
        return Session(token="", name="", role="", types=(), expires=time.time() + 3600)

    def set_cookie(
        self, request: Request, response: Response, session: Session | None, name: str = COOKIE
    ) -> None:
        secure = self.settings.secure_cookies
        if secure is None:
            secure = request.url.scheme == "https"
        if session is None:
            response.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="strict")
            return
        response.set_cookie(
            name,
            self.sealer.seal(session),
            max_age=max(1, round(session.expires - time.time())),
            path="/",
            secure=secure,
            httponly=True,
            samesite="strict",
        )

    def note_failure(self, exc: BaseException) -> None:
        if isinstance(exc, ShardqError) and exc.code == grpc.StatusCode.UNAVAILABLE:
            self.gateway.reset()

    async def attempt(self, work: Awaitable[Any]) -> tuple[Any, str]:
        """(the result, "") or (None, the message to show in place of it)."""
        try:
            return await work, ""
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.note_failure(exc)
            problem = problem_of(exc)
            if problem is None:
                log.exception("dashboard read failed")
                return None, "internal error; see the dashboard's log"
            return None, problem.message

    # -- live streams ---------------------------------------------------------------------------

    def stream(self, session: Session, events: AsyncIterator[str]) -> Response:
        """A server-sent events answer that holds one of the session's and the process's stream
        places while it runs; 429 when none is free."""
        key = session.csrf  # one per session cookie (and per cached bearer token)
        if sum(self._streams.values()) >= MAX_STREAMS:
            raise HTTPProblem(
                429, f"the dashboard serves {MAX_STREAMS} live streams at most: try again later"
            )
        if self._streams.get(key, 0) >= MAX_STREAMS_PER_SESSION:
            raise HTTPProblem(
                429, f"at most {MAX_STREAMS_PER_SESSION} live streams per session: close a page first"
            )
        self._streams[key] = self._streams.get(key, 0) + 1

        def release() -> None:
            left = self._streams.pop(key, 1) - 1
            if left:
                self._streams[key] = left

        return _HeldStream(events, release)

    # -- inputs ---------------------------------------------------------------------------------

    async def inputs(self, request: Request) -> dict[str, str]:
        """Query parameters, then the form or JSON body (bounded), as strings."""
        # A CSRF token never comes from the URL (it would end up in logs and Referer headers).
        values = {k: v for k, v in request.query_params.items() if k != "csrf"}
        if request.method in ("GET", "HEAD"):
            return values
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise HTTPProblem(413, f"request body: at most {MAX_BODY_BYTES} bytes")
        # Read bounded whatever the type, a chunked body (no Content-Length) included; the form
        # parser then reads what was kept.
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise HTTPProblem(413, f"request body: at most {MAX_BODY_BYTES} bytes")
        request._body = body
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            if body:
                try:
                    parsed = json.loads(body)
                except (ValueError, RecursionError):
                    raise HTTPProblem(400, "request body: not JSON (or nested too deep)") from None
                if not isinstance(parsed, dict):
                    raise HTTPProblem(400, "request body: a JSON object")
                for key, value in parsed.items():
                    if isinstance(value, bool):
                        values[str(key)] = "true" if value else "false"
                    elif isinstance(value, str | int | float):
                        values[str(key)] = str(value)
                    else:
                        raise HTTPProblem(400, f"{key}: a string, number or boolean")
        elif content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            form: FormData = await request.form(
                max_files=0, max_fields=MAX_FIELDS, max_part_size=MAX_BODY_BYTES
            )
            values.update({k: v for k, v in form.items() if isinstance(v, str)})
        return values

    def check_csrf(self, request: Request, session: Session, inputs: dict[str, str]) -> None:
        if request.headers.get("authorization", "").lower().startswith("bearer "):
            return  # a browser never adds this header by itself: no cross-site forgery with it
        given = request.headers.get("x-csrf-token") or inputs.get("csrf")  # the body's, not the URL's
        if not same_token(given, session.csrf):
            raise HTTPProblem(403, "CSRF token missing or wrong: reload the page and try again")

    # -- answers --------------------------------------------------------------------------------

    def render(self, request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    def problem_response(self, request: Request, kind: Kind, problem: HTTPProblem) -> Response:
        if kind == "page":
            return self.render(
                request,
                "problem.html",
                {"message": problem.message, "status": problem.status, "session": None, "csrf": ""},
                problem.status,
            )
        if kind == "action" and request.headers.get("hx-request"):
            return self.render(
                request, "_outcome.html", {"ok": False, "message": problem.message}, problem.status
            )
        return JSONResponse({"error": problem.message}, status_code=problem.status)


Handler = Callable[[Call], Awaitable[Response]]


def route(kind: Kind, action_name: str = "") -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """Wrap a handler: find the session (or refuse), check CSRF on actions, log actions with who did
    them, turn every failure into an answer of the route's kind, add the security headers."""

    def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            dash: Dashboard = request.app.state.dashboard
            fresh: Session | None = None
            session: Session | None = None
            try:
                if kind == "page" and _cookie_held_back(request):
                    return _secured(HTMLResponse(RELOAD_PAGE))
                session, is_new = await dash.session_of(request, kind)
                fresh = session if is_new else None
                if session is None:
                    if kind == "page":
                        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                        response: Response = RedirectResponse(f"/signin?next={quote(here, safe='')}", 303)
                        return _secured(response)
                    raise HTTPProblem(401, "sign in first, or send Authorization: Bearer <token>")
                inputs = await dash.inputs(request)
                if kind == "action":
                    dash.check_csrf(request, session, inputs)
                response = await handler(Call(request, session, inputs))
                if kind == "action":
                    log.info(
                        "dashboard action",
                        action=action_name,
                        user=session.name,
                        role=session.role,
                        path=request.url.path,
                        outcome="done",
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                dash.note_failure(exc)
                problem = problem_of(exc)
                if problem is None:
                    log.exception("dashboard request failed", path=request.url.path)
                    problem = HTTPProblem(500, "internal error; see the dashboard's log")
                if kind == "action":
                    log.info(
                        "dashboard action",
                        action=action_name,
                        user=session.name if session else None,
                        role=session.role if session else None,
                        path=request.url.path,
                        outcome="refused",
                        status=problem.status,
                        error=problem.message,
                    )
                response = dash.problem_response(request, kind, problem)
            if fresh is not None:
                dash.set_cookie(request, response, fresh)
            return _secured(response)

        endpoint.__name__ = handler.__name__
        endpoint.__doc__ = handler.__doc__
        return endpoint

    return wrap


#: Answers a link followed from another site: the browser held the SameSite=Strict cookie back,
#: and loading the page again from here sends it (a meta refresh: the CSP allows no script).
RELOAD_PAGE = (
    '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0">'
    "<title>shardq</title></head><body><p>Loading…</p></body></html>"
)


def _cookie_held_back(request: Request) -> bool:
    """A navigation from another site that came without the session cookie."""
    return (
        request.method == "GET"
        and COOKIE not in request.cookies
        and request.headers.get("sec-fetch-site") in ("cross-site", "same-site")
        and request.headers.get("sec-fetch-mode", "navigate") == "navigate"
    )


class _HeldStream(StreamingResponse):
    """An event stream that gives its place back when it ends, however it ends."""

    def __init__(self, events: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def remote_address(request: Request) -> str:
    return request.client.host if request.client else ""


def _secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def outcome(call: Call, data: dict[str, Any], message: str) -> Response:
    """An action's answer: the fragment that says what happened (htmx), or the data as JSON."""
    if call.request.headers.get("hx-request"):
        dash: Dashboard = call.request.app.state.dashboard
        return dash.render(call.request, "_outcome.html", {"ok": True, "message": message, "data": data})
    return JSONResponse(data)


def when(ms: int | None) -> str:
    """A wall-clock millisecond timestamp as ISO 8601 UTC; "–" for none."""
    if not ms:
        return "–"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def secured(response: Response) -> Response:
    return _secured(response)


def html(text: str) -> HTMLResponse:
    return HTMLResponse(text)

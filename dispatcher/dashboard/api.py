"""The JSON API behind the pages (its description: /api/openapi.json, made from ENDPOINTS below).

Reads are GET; actions are POST and need the admin role at the dispatcher, plus a CSRF token from
a browser session (header X-CSRF-Token or form field csrf) or a bearer token
(``Authorization: Bearer <token>``, for scripts).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import operations as ops
from .errors import problem_of
from .rates import Window
from .web import Call, Dashboard, outcome, route

#: The overview's live stream sends a point this often, and ends after MAX_STREAM_S (the browser's
#: EventSource reconnects by itself), so no stream is held forever.
OVERVIEW_EVERY_S = 1.0
MAX_STREAM_S = 600.0


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path", "query" or "body"
    description: str
    required: bool = False
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    summary: str
    handler: Any
    params: tuple[Param, ...] = field(default_factory=tuple)
    action: bool = False
    stream: bool = False


_TYPE = Param("type", "query", "job type (exact)")
_REASON = Param("reason", "query", "dead reason", enum=ops.DEAD_REASONS)
_PRIORITY = Param("priority", "body", "priority class; empty: every class", enum=ops.PRIORITIES)


def _dead_filter(call: Call) -> tuple[str | None, str | None]:
    return ops.job_type(call.get("type")), ops.dead_reason(call.get("reason"))


def _ops(call: Call) -> ops.Operations:
    dash: Dashboard = call.request.app.state.dashboard
    return dash.ops


@route("api")
async def me(call: Call) -> Response:
    s = call.session
    return JSONResponse({"name": s.name, "role": s.role, "types": list(s.types), "may_act": s.may_act})


@route("api")
async def overview(call: Call) -> Response:
    return JSONResponse(await _ops(call).overview_point(call.session, Window()))


@route("api")
async def overview_stream(call: Call) -> Response:
    """Server-sent events: one ``point`` event (JSON) a second; ``problem`` when a sample fails."""
    count = ops.bounded_int(call.get("count"), "count", 0, 0, 10_000)
    every = (
        ops.bounded_int(call.get("every_ms"), "every_ms", int(OVERVIEW_EVERY_S * 1000), 1000, 60_000) / 1000
    )
    operations, session, request = _ops(call), call.session, call.request

    async def events() -> AsyncIterator[str]:
        window = Window()
        loop = asyncio.get_running_loop()
        ends = loop.time() + MAX_STREAM_S
        sent = 0
        while loop.time() < ends and not await request.is_disconnected():
            try:
                point = await operations.overview_point(session, window)
                yield f"event: point\ndata: {json.dumps(point)}\n\n"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                call.request.app.state.dashboard.note_failure(exc)
                problem = problem_of(exc)
                message = problem.message if problem else "internal error; see the dashboard's log"
                yield f"event: problem\ndata: {json.dumps({'error': message})}\n\n"
            sent += 1
            if count and sent >= count:
                return
            await asyncio.sleep(every)

    dash: Dashboard = call.request.app.state.dashboard
    return dash.stream(session, events())


@route("api")
async def queues(call: Call) -> Response:
    return JSONResponse({"queues": await _ops(call).queues(call.session)})


@route("action", "pause queue")
async def pause_queue(call: Call) -> Response:
    return await _pause_or_resume_queue(call, pause=True)


@route("action", "resume queue")
async def resume_queue(call: Call) -> Response:
    return await _pause_or_resume_queue(call, pause=False)


async def _pause_or_resume_queue(call: Call, *, pause: bool) -> Response:
    name = ops.job_type(call.request.path_params["type"], required=True)
    assert name is not None
    prio = ops.priority(call.get("priority"))
    data = await _ops(call).pause_queue(call.session, name, prio, pause=pause)
    verb = "paused" if pause else "resumed"
    return outcome(call, data, f"{name} {verb}" + (f" ({prio})" if prio else ""))


@route("api")
async def job(call: Call) -> Response:
    return JSONResponse(await _ops(call).job(call.session, call.request.path_params["id"]))


@route("action", "cancel job")
async def cancel_job(call: Call) -> Response:
    data = await _ops(call).cancel(call.session, call.request.path_params["id"])
    return outcome(call, data, f"cancel: the job is {data['status']}")


@route("action", "run job now")
async def run_job_now(call: Call) -> Response:
    data = await _ops(call).run_now(call.session, call.request.path_params["id"])
    return outcome(call, data, "runs now")


@route("action", "requeue job")
async def requeue_job(call: Call) -> Response:
    data = await _ops(call).requeue(call.session, call.request.path_params["id"])
    message = "requeued" if data["requeued"] else "not requeued: the job is not dead"
    return outcome(call, data, message)


@route("api")
async def search_jobs(call: Call) -> Response:
    limit = ops.bounded_int(call.get("limit"), "limit", ops.JOBS_PAGE, 1, ops.MAX_JOBS_PAGE)
    order = call.get("order", "newest")
    if order not in ("newest", "oldest"):
        raise ops.BadInput("order: newest or oldest")
    page = await _ops(call).search(
        call.session, call.inputs, limit=limit, cursor=call.get("cursor"), oldest_first=order == "oldest"
    )
    return JSONResponse(page)


@route("action", "bulk action on jobs")
async def bulk_jobs(call: Call) -> Response:
    dry_run = call.get("dry_run") in ("1", "true")
    data = await _ops(call).bulk(call.session, call.get("action"), call.inputs, dry_run=dry_run)
    verb = data["action"].replace("_", " ")
    if dry_run:
        message = f"dry run: {data['matched']} jobs match, {verb} would apply to them"
    else:
        message = f"{verb}: {data['touched']} of {data['matched']} matching jobs" + (
            " (more left: run it again)" if data["more"] else ""
        )
    return outcome(call, data, message)


@route("api")
async def dead(call: Call) -> Response:
    name, reason = _dead_filter(call)
    limit = ops.bounded_int(call.get("limit"), "limit", ops.DEAD_PAGE, 1, ops.MAX_DEAD_PAGE)
    after = ops.job_id(call.get("after"), "after") if call.get("after") else ""
    return JSONResponse(await _ops(call).dead(call.session, name, reason, after, limit))


@route("api")
async def dead_count(call: Call) -> Response:
    name, reason = _dead_filter(call)
    return JSONResponse(await _ops(call).dead_count(call.session, name, reason))


@route("action", "requeue dead jobs")
async def requeue_dead(call: Call) -> Response:
    name, reason = _dead_filter(call)
    if call.get("dry_run") in ("1", "true"):
        data = await _ops(call).dead_count(call.session, name, reason)
        more = "about " if data["at_least"] else ""
        return outcome(call, data, f"dry run: {more}{data['count']} dead jobs would be requeued")
    data = await _ops(call).requeue_dead(call.session, name, reason)
    return outcome(call, data, f"requeued {data['requeued']} jobs")


@route("action", "purge dead jobs")
async def purge_dead(call: Call) -> Response:
    name, reason = _dead_filter(call)
    if call.get("dry_run") in ("1", "true"):
        data = await _ops(call).dead_count(call.session, name, reason)
        more = "about " if data["at_least"] else ""
        return outcome(call, data, f"dry run: {more}{data['count']} dead jobs would be purged")
    data = await _ops(call).purge_dead(call.session, name, reason)
    return outcome(call, data, f"purged {data['purged']} jobs")


@route("api")
async def schedules(call: Call) -> Response:
    return JSONResponse({"schedules": await _ops(call).schedules(call.session)})


@route("action", "pause schedule")
async def pause_schedule(call: Call) -> Response:
    data = await _ops(call).pause_schedule(call.session, call.request.path_params["name"], pause=True)
    return outcome(call, data, f"{data['name']} paused")


@route("action", "resume schedule")
async def resume_schedule(call: Call) -> Response:
    data = await _ops(call).pause_schedule(call.session, call.request.path_params["name"], pause=False)
    return outcome(call, data, f"{data['name']} resumed")


@route("action", "run schedule now")
async def run_schedule(call: Call) -> Response:
    data = await _ops(call).run_schedule_now(call.session, call.request.path_params["name"])
    return outcome(call, data, f"{data['name']}: enqueued job {data['job_id']}")


@route("api")
async def workers(call: Call) -> Response:
    return JSONResponse({"workers": await _ops(call).workers(call.session)})


@route("api")
async def shards(call: Call) -> Response:
    return JSONResponse(await _ops(call).shards(call.session))


@route("action", "rebalance")
async def rebalance(call: Call) -> Response:
    dry_run = call.get("dry_run") in ("1", "true")
    data = await _ops(call).rebalance(call.session, dry_run=dry_run)
    moves = len(data["moves"])
    message = f"dry run: {moves} shard moves planned" if dry_run else f"rebalancing: {moves} shard moves"
    return outcome(call, data, message)


_SEARCH = (
    Param("type", "query", "job types or patterns (billing.*), comma-separated"),
    Param("status", "query", "states, comma-separated", enum=ops.STATUSES),
    Param("priority", "query", "priority classes, comma-separated", enum=ops.PRIORITIES),
    Param("created_after", "query", "ISO 8601 (UTC unless an offset is given) or epoch seconds"),
    Param("created_before", "query", "ISO 8601 or epoch seconds"),
    Param("finished_after", "query", "ISO 8601 or epoch seconds"),
    Param("finished_before", "query", "ISO 8601 or epoch seconds"),
    Param("idempotency_key", "query", "exact"),
    Param("schedule", "query", "the schedule that made the job"),
    Param("error", "query", "a substring of the last error"),
    Param("payload", "query", 'payload fields: customer_id = 42; region = "eu"'),
    Param("reason", "query", "dead reason", enum=ops.DEAD_REASONS),
)
_DRY = Param("dry_run", "body", "true: count (or plan) only, change nothing", enum=("true", "false"))

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/api/me", "who the session or token stands for", me),
    Endpoint("GET", "/api/overview", "one sample: depth by state, oldest ready age", overview),
    Endpoint(
        "GET",
        "/api/overview/stream",
        "server-sent events: a point a second (rates, latency percentiles, depth)",
        overview_stream,
        (
            Param("count", "query", "end after this many points (0: run on)"),
            Param("every_ms", "query", "milliseconds between points (1000..60000)"),
        ),
        stream=True,
    ),
    Endpoint("GET", "/api/queues", "every type x priority: depth, rates, oldest ready, paused", queues),
    Endpoint(
        "POST",
        "/api/queues/{type}/pause",
        "pause a job type (or one class)",
        pause_queue,
        (Param("type", "path", "job type", True), _PRIORITY),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/queues/{type}/resume",
        "resume a job type (or one class)",
        resume_queue,
        (Param("type", "path", "job type", True), _PRIORITY),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "GET",
        "/api/jobs",
        "search jobs (newest first; by finish time with a finished range), a page at a time",
        search_jobs,
        (
            *_SEARCH,
            Param("order", "query", "newest or oldest first", enum=("newest", "oldest")),
            Param("cursor", "query", "the previous page's next_cursor"),
            Param("limit", "query", f"1..{ops.MAX_JOBS_PAGE}"),
        ),
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/jobs/bulk",
        "cancel, requeue, run now or delete every job the filter selects",
        bulk_jobs,
        (
            *_SEARCH,
            Param("action", "body", "what to do", True, ops.BULK_ACTIONS),
            _DRY,
            Param("all", "body", "true: confirms an empty filter (every job)", enum=("true", "false")),
        ),
        action=True,
    ),  # fmt: skip
    Endpoint("GET", "/api/jobs/{id}", "a job", job, (Param("id", "path", "job id", True),)),
    Endpoint(
        "POST",
        "/api/jobs/{id}/cancel",
        "cancel a job",
        cancel_job,
        (Param("id", "path", "job id", True),),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/jobs/{id}/run-now",
        "run a delayed (waiting or retrying) job now",
        run_job_now,
        (Param("id", "path", "job id", True),),
        action=True,
    ),
    Endpoint(
        "POST",
        "/api/jobs/{id}/requeue",
        "requeue a dead job",
        requeue_job,
        (Param("id", "path", "job id", True),),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "GET",
        "/api/dead",
        "dead jobs, a page at a time",
        dead,
        (
            _TYPE,
            _REASON,
            Param("after", "query", "the last id of the previous page"),
            Param("limit", "query", f"1..{ops.MAX_DEAD_PAGE}"),
        ),
    ),  # fmt: skip
    Endpoint("GET", "/api/dead/count", "how many dead jobs match", dead_count, (_TYPE, _REASON)),
    Endpoint(
        "POST",
        "/api/dead/requeue",
        "requeue every dead job that matches",
        requeue_dead,
        (_TYPE, _REASON, _DRY),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/dead/purge",
        "delete every dead job that matches",
        purge_dead,
        (_TYPE, _REASON, _DRY),
        action=True,
    ),  # fmt: skip
    Endpoint("GET", "/api/schedules", "schedules with their next occurrences", schedules),
    Endpoint(
        "POST",
        "/api/schedules/{name}/pause",
        "pause a schedule",
        pause_schedule,
        (Param("name", "path", "schedule name", True),),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/schedules/{name}/resume",
        "resume a schedule",
        resume_schedule,
        (Param("name", "path", "schedule name", True),),
        action=True,
    ),  # fmt: skip
    Endpoint(
        "POST",
        "/api/schedules/{name}/run",
        "enqueue the schedule's job now",
        run_schedule,
        (Param("name", "path", "schedule name", True),),
        action=True,
    ),  # fmt: skip
    Endpoint("GET", "/api/workers", "connected workers, every dispatcher's", workers),
    Endpoint("GET", "/api/shards", "the shard map: owners, epochs, depth", shards),
    Endpoint(
        "POST",
        "/api/shards/rebalance",
        "plan (dry run) or apply a rebalance",
        rebalance,
        (_DRY,),
        action=True,
    ),
)


def openapi() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for e in ENDPOINTS:
        operation: dict[str, Any] = {
            "summary": e.summary,
            "operationId": e.handler.__name__,
            "parameters": [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "description": p.description,
                    "schema": {"type": "string", **({"enum": list(p.enum)} if p.enum else {})},
                }
                for p in e.params
                if p.where != "body"
            ],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"text/event-stream" if e.stream else "application/json": {}},
                },
                "400": {"description": 'bad input: {"error": message}'},
                "401": {"description": "no session and no bearer token"},
                "403": {"description": "refused: role, type scope or CSRF"},
                "404": {"description": "not found"},
                "503": {"description": "the dispatcher is unavailable"},
            },
        }
        body = [p for p in e.params if p.where == "body"]
        if body:
            schema = {
                "type": "object",
                "properties": {
                    p.name: {
                        "type": "string",
                        "description": p.description,
                        **({"enum": list(p.enum)} if p.enum else {}),
                    }
                    for p in body
                },
            }
            operation["requestBody"] = {
                "required": False,
                "content": {
                    "application/json": {"schema": schema},
                    "application/x-www-form-urlencoded": {"schema": schema},
                },
            }
        if e.action:
            operation["security"] = [{"bearer": []}, {"session": [], "csrf": []}]
        paths.setdefault(e.path, {})[e.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "shardq dashboard API", "version": "1"},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "a dispatcher token"},
                "session": {"type": "apiKey", "in": "cookie", "name": "shardq_session"},
                "csrf": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token"},
            }
        },
    }


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi())


def routes() -> list[Route]:
    out = [Route(e.path, e.handler, methods=[e.method]) for e in ENDPOINTS]
    out.append(Route("/api/openapi.json", openapi_json, methods=["GET"]))
    return out

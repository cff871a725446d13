"""The HTML pages: each reads through the same operations as the JSON API and shows a failed read's
message in place of the part it could not fill."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from . import operations as ops
from .errors import HTTPProblem, problem_of
from .rates import Window
from .sessions import COOKIE, SIGNIN_COOKIE, same_token
from .web import Call, Dashboard, log, remote_address, route, secured

QUEUES_EVERY_S = 2.0
MAX_STREAM_S = 600.0
NAV = (
    ("/", "Overview"),
    ("/queues", "Queues"),
    ("/jobs", "Jobs"),
    ("/dead", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/workers", "Workers and shards"),
)


def _dash(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


def _page(call: Call, template: str, **context: Any) -> Response:
    base = {"session": call.session, "csrf": call.session.csrf, "nav": NAV, "path": call.request.url.path}
    return _dash(call.request).render(call.request, template, {**base, **context})


@route("page")
async def overview(call: Call) -> Response:
    dash = _dash(call.request)
    point, error = await dash.attempt(dash.ops.overview_point(call.session, Window()))
    return _page(call, "overview.html", point=point, error=error)


@route("page")
async def queues(call: Call) -> Response:
    dash = _dash(call.request)
    rows, error = await dash.attempt(dash.ops.queues(call.session))
    return _page(call, "queues.html", rows=rows or [], error=error)


@route("api")
async def queues_stream(call: Call) -> Response:
    """Server-sent events for htmx: a ``rows`` event with the queue table's rows every 2 s."""
    dash, session, request = _dash(call.request), call.session, call.request
    count = ops.bounded_int(call.get("count"), "count", 0, 0, 10_000)

    async def events() -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        ends, sent = loop.time() + MAX_STREAM_S, 0
        while loop.time() < ends and not await request.is_disconnected():
            rows, error = await dash.attempt(dash.ops.queues(session))
            text = dash.templates.get_template("_queue_rows.html").render(
                rows=rows or [], error=error, session=session, csrf=session.csrf
            )
            data = "\n".join(f"data: {line}" for line in text.splitlines() if line.strip())
            yield f"event: rows\n{data}\n\n"
            sent += 1
            if count and sent >= count:
                return
            await asyncio.sleep(QUEUES_EVERY_S)

    return dash.stream(session, events())


@route("page")
async def jobs(call: Call) -> Response:
    """The search form; its fields are the URL's query, so a search can be shared and bookmarked."""
    wanted = call.get("id").strip()
    if wanted:
        try:
            ops.job_id(wanted, "id")
        except ops.BadInput as exc:
            return _page(call, "jobs.html", error=str(exc), query=call.inputs, page=None, **_choices())
        return RedirectResponse(f"/jobs/{wanted}", 303)
    dash = _dash(call.request)

    async def load() -> dict[str, Any]:
        limit = ops.bounded_int(call.get("limit"), "limit", ops.JOBS_PAGE, 1, ops.MAX_JOBS_PAGE)
        order = call.get("order", "newest")
        if order not in ("newest", "oldest"):
            raise ops.BadInput("order: newest or oldest")
        return await dash.ops.search(
            call.session, call.inputs, limit=limit, cursor=call.get("cursor"), oldest_first=order == "oldest"
        )

    page, error = await dash.attempt(load())
    query = {k: v for k, v in call.inputs.items() if k != "cursor"}
    bulk_filter = {name: call.get(name) for name in ops.SEARCH_FIELDS}
    return _page(
        call, "jobs.html", error=error, query=query, page=page, bulk_filter=bulk_filter,
        bulk_filter_set=any(bulk_filter.values()), **_choices(),
    )  # fmt: skip


def _choices() -> dict[str, Any]:
    return {"statuses": ops.STATUSES, "priorities": ops.PRIORITIES, "reasons": ops.DEAD_REASONS}


@route("page")
async def job(call: Call) -> Response:
    dash = _dash(call.request)
    data, error = await dash.attempt(dash.ops.job(call.session, call.request.path_params["id"]))
    return _page(call, "job.html", job=data, error=error, job_id=call.request.path_params["id"])


@route("api")
async def job_live(call: Call) -> Response:
    """The job page's live part (state, progress, attempts), polled by htmx while the job is not
    finished; a failed read shows its message in its place."""
    dash = _dash(call.request)
    data, error = await dash.attempt(dash.ops.job(call.session, call.request.path_params["id"]))
    if data is None:
        return HTMLResponse(
            f'<div id="job-live"><p class="flash error" role="alert">{escape(error)}</p></div>'
        )
    return _dash(call.request).render(call.request, "_job_live.html", {"job": data, "session": call.session})


@route("page")
async def dead(call: Call) -> Response:
    dash = _dash(call.request)
    filters = {"type": call.get("type"), "reason": call.get("reason"), "after": call.get("after")}

    async def load() -> dict[str, Any]:
        name, reason = ops.job_type(filters["type"]), ops.dead_reason(filters["reason"])
        after = ops.job_id(filters["after"], "after") if filters["after"] else ""
        return await dash.ops.dead(call.session, name, reason, after, ops.DEAD_PAGE)

    page, error = await dash.attempt(load())
    try:  # the bulk buttons repeat the filter: none for one that is not valid
        ops.job_type(filters["type"]), ops.dead_reason(filters["reason"])
        filters_ok = True
    except ops.BadInput:
        filters_ok = False
    return _page(
        call,
        "dead.html",
        page=page,
        error=error,
        filters=filters,
        filters_ok=filters_ok,
        reasons=ops.DEAD_REASONS,
    )


@route("page")
async def schedules(call: Call) -> Response:
    dash = _dash(call.request)
    rows, error = await dash.attempt(dash.ops.schedules(call.session))
    return _page(call, "schedules.html", rows=rows or [], error=error)


@route("page")
async def workers(call: Call) -> Response:
    dash = _dash(call.request)
    (found, error), (shard_map, shard_error) = await asyncio.gather(
        dash.attempt(dash.ops.workers(call.session)), dash.attempt(dash.ops.shards(call.session))
    )
    return _page(
        call, "workers.html", workers=found or [], error=error, shards=shard_map, shard_error=shard_error
    )


# -- signing in and out --------------------------------------------------------------------------


async def signin(request: Request) -> Response:
    """GET: the form. POST: check the token with the dispatcher (WhoAmI) and seal it into the
    session cookie. The form's CSRF token comes from a pre-session cookie."""
    dash = _dash(request)
    pre = dash.sealer.open(request.cookies.get(SIGNIN_COOKIE))
    if pre is None or pre.signed_in:
        pre = dash.pre_session()
    context: dict[str, Any] = {"session": None, "csrf": pre.csrf, "error": "", "next": "/"}
    status = 200
    if request.method == "POST":
        try:
            inputs = await dash.inputs(request)
            context["next"] = _local(inputs.get("next", "/"))
            if not same_token(inputs.get("csrf"), pre.csrf):
                raise HTTPProblem(403, "CSRF token missing or wrong: reload the page and try again")
            token = inputs.get("token", "").strip()
            if not token or len(token) > 4096:
                raise HTTPProblem(400, "token: required (at most 4096 characters)")
            who = await dash.checked_identity(request, token, "sign-in")
            if not who["auth"]:
                raise HTTPProblem(400, "the dispatcher checks no tokens: no sign-in needed")
            session = dash.new_session(token, who)
            response: Response = RedirectResponse(context["next"], 303)
            dash.set_cookie(request, response, session)
            dash.set_cookie(request, response, None, SIGNIN_COOKIE)
            log.info(
                "dashboard sign-in", user=session.name, role=session.role, remote=remote_address(request)
            )
            return secured(response)
        except Exception as exc:
            problem = problem_of(exc) or HTTPProblem(500, "internal error; see the dashboard's log")
            if problem.status == 401:
                problem = HTTPProblem(401, "this token is not known to the dispatcher")
            context["error"], status = problem.message, problem.status
    else:
        context["next"] = _local(request.query_params.get("next", "/"))
    response = dash.render(request, "signin.html", context, status)
    dash.set_cookie(request, response, pre, SIGNIN_COOKIE)
    return secured(response)


async def signout(request: Request) -> Response:
    dash = _dash(request)
    session = dash.sealer.open(request.cookies.get(COOKIE))
    try:
        inputs = await dash.inputs(request)
        if session is None or not same_token(
            request.headers.get("x-csrf-token") or inputs.get("csrf"), session.csrf
        ):
            raise HTTPProblem(403, "CSRF token missing or wrong")
    except Exception as exc:
        problem = problem_of(exc) or HTTPProblem(500, "internal error; see the dashboard's log")
        return secured(dash.problem_response(request, "action", problem))
    assert session is not None
    log.info("dashboard sign-out", user=session.name, role=session.role, remote=remote_address(request))
    response = RedirectResponse("/signin", 303)
    dash.set_cookie(request, response, None)
    return secured(response)


def _local(path: str) -> str:
    """Only a path of this site to go on to after sign-in (no open redirect)."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


def routes() -> list[Route]:
    return [
        Route("/", overview),
        Route("/queues", queues),
        Route("/queues/stream", queues_stream),
        Route("/jobs", jobs),
        Route("/jobs/{id}", job),
        Route("/jobs/{id}/live", job_live),
        Route("/dead", dead),
        Route("/schedules", schedules),
        Route("/workers", workers),
        Route("/signin", signin, methods=["GET", "POST"]),
        Route("/signout", signout, methods=["POST"]),
    ]

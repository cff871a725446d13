"""The dashboard's pages and JSON API with Starlette's TestClient, against a real dispatcher, Redis
and database (both backends) and a real worker; auth off (the loopback default). The signed-in
roles, scopes and CSRF are in test_dashboard_auth.py; a real browser in test_dashboard_browser.py."""

from __future__ import annotations

import contextlib
import html
import json
import re

import pytest
import structlog

from dispatcher.dashboard import api
from tests.e2e.conftest import TEST_SETTINGS
from tests.support.dashboard import csrf_of, dashboard_client, sse_events
from tests.support.processes import DispatcherProcess, WorkerProcess
from tests.support.redis_server import RedisServer
from tests.support.wait import wait_until
from worker_sdk import Client

TYPES = (
    "noop.ok", "noop.act", "noop.burst", "noop.rate", "noop.nightly", "final.bad", "final.act",
    "final.bulk", "progress.report",
)  # fmt: skip
PAGES = ("/", "/queues", "/jobs", "/dead", "/schedules", "/workers")
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|\son[a-z]+\s*=|javascript:", re.IGNORECASE)


@pytest.fixture(scope="module")
def stack(module_db_url, tmp_path_factory):
    """Per database backend, one dispatcher (on a Redis of its own) with a worker, a succeeded job,
    a dead job and a schedule, shared by the module's tests: a test that changes something does it
    to job types of its own."""
    root = tmp_path_factory.mktemp("dashboard")
    db_url = module_db_url
    with contextlib.ExitStack() as stack:
        redis = RedisServer(root / "redis")
        redis.start()
        stack.callback(redis.stop)
        dispatcher = DispatcherProcess(redis.url, db_url, root, **TEST_SETTINGS)
        stack.callback(dispatcher.kill)
        dispatcher.start()
        worker = WorkerProcess(dispatcher.target, root / "ledger.jsonl", root, types=",".join(TYPES))
        stack.callback(worker.kill)
        worker.start()
        client = stack.enter_context(Client(dispatcher.target, timeout=10))
        done = client.enqueue("noop.ok", {"customer_id": 42, "note": "hello"})
        dead = client.enqueue("final.bad", {"customer_id": 7})
        client.upsert_schedule(name="nightly.report", cron="0 3 * * *", job_type="noop.nightly",
                               timezone="Europe/Paris", payload={"k": 1})  # fmt: skip
        wait_until(lambda: client.get_job(done).status == "succeeded", 20)
        wait_until(lambda: client.get_job(dead).status == "dead", 20)
        yield dispatcher, client, {"done": done, "dead": dead}


def dead_job(client: Client, job_type: str) -> str:
    job = client.enqueue(job_type, {"for": "this test"})
    wait_until(lambda: client.get_job(job).status == "dead", 20)
    return job


def test_every_page_renders_with_its_data_and_no_inline_script(stack):
    dispatcher, client, ids = stack
    with dashboard_client(dispatcher.target) as web:
        for path in PAGES:
            page = web.get(path)
            assert page.status_code == 200, (path, page.text)
            assert not INLINE_SCRIPT.search(page.text), path
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe" not in csp
            assert page.headers["x-frame-options"] == "DENY"
        assert "noop.ok" in web.get("/queues").text
        dead_page = web.get("/dead?type=final.bad&reason=not_retryable").text
        assert ids["dead"] in dead_page and "not_retryable" in dead_page
        assert ids["done"] not in web.get("/dead?type=noop.ok").text
        schedules = web.get("/schedules").text
        assert "nightly.report" in schedules and "+01:00" in schedules and "+00:00" in schedules
        job = web.get(f"/jobs/{ids['done']}").text
        assert "succeeded" in job and "&#34;customer_id&#34;: 42" in job
        assert "#1 succeeded" in job and "hx-trigger" not in job  # finished: no polling
        dead_job = web.get(f"/jobs/{ids['dead']}").text
        assert "#1 failed" in dead_job and "Requeue" in dead_job
        live = web.get(f"/jobs/{ids['dead']}/live")
        assert live.status_code == 200 and 'id="job-live"' in live.text and "#1 failed" in live.text
        assert "flash error" in web.get("/jobs/no!such/live").text
        assert web.get(f"/jobs?id={ids['done']}").headers["location"] == f"/jobs/{ids['done']}"
        workers = web.get("/workers").text
        assert "noop" in workers and "8 shards" in workers
        for path in ("/static/vendor/htmx-2.0.11.min.js", "/static/vendor/uPlot-1.6.32.iife.min.js",
                     "/static/dashboard.js", "/static/vendor/htmx.LICENSE"):  # fmt: skip
            assert web.get(path).status_code == 200, path
        assert web.get("/healthz").text == "ok"


def test_the_job_page_shows_progress_while_it_runs_then_the_result(stack):
    dispatcher, client, _ = stack
    payload = {"steps": 4, "step_sleep": 0.5, "result": {"rows": 3}}
    job = client.enqueue("progress.report", payload)
    with dashboard_client(dispatcher.target) as web:
        live = wait_until(
            lambda: (t := web.get(f"/jobs/{job}/live").text) and 'max="1" value="0.' in t and t, 20
        )
        assert 'hx-trigger="every 2s"' in live  # still running: the part polls itself
        wait_until(lambda: client.get_job(job).status == "succeeded", 20)
        page = web.get(f"/jobs/{job}").text
        assert 'value="1.0"' in page and "&#34;rows&#34;: 3" in page and "hx-trigger" not in page


def test_the_json_api_answers_and_is_described(stack):
    dispatcher, client, ids = stack
    with dashboard_client(dispatcher.target) as web:
        spec = web.get("/api/openapi.json").json()
        described = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
        assert described == {(e.method, e.path) for e in api.ENDPOINTS}
        assert web.get("/api/me").json() == {
            "name": "anonymous",
            "role": "admin",
            "types": [],
            "may_act": True,
        }
        overview = web.get("/api/overview").json()
        assert overview["depth"]["dead"] >= 1 and overview["processes"] == 1
        queues = web.get("/api/queues").json()["queues"]
        assert {"type": "final.bad", "priority": "default"}.items() <= next(
            q for q in queues if q["type"] == "final.bad"
        ).items()
        job = web.get(f"/api/jobs/{ids['done']}").json()
        assert job["status"] == "succeeded" and job["payload"]["json"] == {"customer_id": 42, "note": "hello"}
        dead = web.get("/api/dead", params={"type": "final.bad"}).json()
        assert [j["id"] for j in dead["jobs"]] == [ids["dead"]] and dead["next_after"] == ""
        assert web.get("/api/dead/count", params={"type": "final.bad"}).json() == {
            "count": 1,
            "at_least": False,
        }
        schedule = web.get("/api/schedules").json()["schedules"][0]
        assert schedule["name"] == "nightly.report" and len(schedule["next"]) == 3
        workers = web.get("/api/workers").json()["workers"]
        assert workers and set(workers[0]["job_types"]) == set(TYPES)
        assert workers[0]["concurrency"] == 16 and workers[0]["last_seen_ms"] > 0
        shards = web.get("/api/shards").json()
        assert shards["shard_count"] == 8 and len(shards["shards"]) == 8


def test_the_overview_stream_shows_work_as_it_happens(stack):
    dispatcher, client, _ = stack
    with dashboard_client(dispatcher.target) as web:
        seen: list[dict] = []
        with web.stream("GET", "/api/overview/stream", params={"every_ms": 1000, "count": 100}) as stream:
            lines = stream.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    break
            client.enqueue_many([{"type": "noop.burst", "payload": {"i": i}} for i in range(20)])
            for line in lines:
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["rates"]["succeeded"] > 0 and seen[-1]["latency_s"]["p50"] is not None:
                        break
        last = seen[-1]
        assert last["rates"]["succeeded"] > 0 and 0 < last["latency_s"]["p50"] <= last["latency_s"]["p99"]
        assert max(p["rates"]["enqueued"] for p in seen) > 0 and max(p["rates"]["started"] for p in seen) > 0
        assert seen[0]["rates"] == dict.fromkeys(
            ["enqueued", "started", "succeeded", "failed", "dead_lettered"], 0.0
        )
        assert len(seen) < 100, "the burst never showed in the rates"
        rows = web.get("/queues/stream", params={"count": 1}).text
        ((name, data),) = sse_events(rows)
        assert name == "rows" and "noop.burst" in data


def test_the_queue_table_rates_count_the_work_since_the_last_look(stack):
    dispatcher, client, _ = stack
    with dashboard_client(dispatcher.target) as web:
        web.get("/api/queues")  # this look's counters are the next one's base
        client.enqueue_many([{"type": "noop.rate", "payload": {"i": i}} for i in range(30)])
        best: dict[str, float] = {}

        def all_seen() -> bool:
            for q in web.get("/api/queues").json()["queues"]:
                if q["type"] == "noop.rate":
                    for name, rate in q["rates"].items():
                        best[name] = max(best.get(name, 0.0), rate)
            return all(best.get(f, 0) > 0 for f in ("enqueued", "started", "succeeded"))

        wait_until(all_seen, 20, interval=0.2)
        assert best["failed"] == 0 and best["dead_lettered"] == 0


def test_actions_need_the_csrf_token_change_things_and_are_logged(stack):
    dispatcher, client, _ = stack
    dead = dead_job(client, "final.act")
    client.enqueue("noop.act", {})
    with dashboard_client(dispatcher.target) as web:
        token = csrf_of(web.get("/queues").text)
        refused = web.post("/api/queues/noop.act/pause", data={})
        assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
        assert not client.get_queue("noop.act").settings.paused
        wrong = web.post("/api/queues/noop.act/pause", headers={"X-CSRF-Token": token + "x"})
        assert wrong.status_code == 403
        with structlog.testing.capture_logs() as logs:
            htmx = {"X-CSRF-Token": token, "HX-Request": "true"}
            done = web.post("/api/queues/noop.act/pause", headers=htmx, data={"priority": "high"})
        assert done.status_code == 200 and "noop.act paused (high)" in done.text
        assert client.get_queue("noop.act").settings.paused == ("high",)
        assert {
            "event": "dashboard action",
            "action": "pause queue",
            "user": "anonymous",
            "outcome": "done",
        }.items() <= logs[-1].items()
        assert web.post("/api/queues/noop.act/resume", data={"csrf": token}).json()["paused"] == []
        # A form's hidden field serves as well as the header.
        dry = {"csrf": token, "dry_run": "true", "type": "final.act"}
        assert web.post("/api/dead/requeue", data=dry).json()["count"] == 1
        assert (
            web.post("/api/shards/rebalance", data={"csrf": token, "dry_run": "true"}).json()["applied"]
            is False
        )
        paused = web.post("/api/schedules/nightly.report/pause", data={"csrf": token}).json()
        assert paused == {"name": "nightly.report", "enabled": False}
        assert web.post("/api/schedules/nightly.report/resume", data={"csrf": token}).json()["enabled"]
        ran = web.post("/api/schedules/nightly.report/run", data={"csrf": token}).json()
        assert client.get_job(ran["job_id"]).type == "noop.nightly"
        requeued = web.post(f"/api/jobs/{dead}/requeue", data={"csrf": token}).json()
        assert requeued == {"id": dead, "requeued": 1}
        wait_until(lambda: client.get_job(dead).attempts == 2, 20)
        wait_until(lambda: client.get_job(dead).status == "dead", 20)
        assert web.post(
            "/api/dead/purge", json={"type": "final.act"}, headers={"X-CSRF-Token": token}
        ).json() == {"purged": 1}
        later = client.enqueue("noop.act", {"later": True}, delay=3600)
        assert "Run now" in web.get(f"/jobs/{later}").text
        assert web.post(f"/api/jobs/{later}/run-now", data={"csrf": token}).json() == {
            "id": later,
            "ran_now": 1,
        }
        wait_until(lambda: client.get_job(later).status == "succeeded", 20)
        again = web.post(f"/api/jobs/{later}/run-now", data={"csrf": token})
        assert again.status_code == 409 and "only a delayed job" in again.json()["error"]
        assert client.dead_letters(job_type="final.act") == []


def test_the_job_search_filters_pages_and_acts_by_filter(stack):
    dispatcher, client, ids = stack
    with dashboard_client(dispatcher.target) as web:
        assert 'id="search-form"' in web.get("/jobs").text
        found = web.get("/api/jobs", params={"payload": "customer_id = 42"}).json()
        assert [j["id"] for j in found["jobs"]] == [ids["done"]] and found["total"] == 1
        page = web.get("/jobs", params={"payload": "customer_id = 42", "type": "noop.*"})
        assert page.status_code == 200 and ids["done"] in page.text and ids["dead"] not in page.text
        assert 'value="customer_id = 42"' in page.text  # the filters stay in the form (and the URL)
        client.enqueue_many([{"type": "noop.ok", "payload": {"batch": 1, "i": i}} for i in range(5)])
        seen, cursor = [], ""
        while True:
            got = web.get("/api/jobs", params={"payload": "batch = 1", "limit": 2, "cursor": cursor}).json()
            seen += [j["id"] for j in got["jobs"]]
            cursor = got["next_cursor"]
            if not cursor:
                break
        assert len(seen) == 5 == len(set(seen)) and seen == sorted(seen, reverse=True)
        for params, message in [
            ({"status": "sleeping"}, "status: 'sleeping' is not one of"),
            ({"payload": "no equals sign"}, "payload: expected path = value"),
            ({"created_after": "yesterday"}, "created_after: an ISO 8601 date-time"),
            ({"order": "random"}, "order: newest or oldest"),
            ({"cursor": "forged"}, "cursor"),
        ]:
            refused = web.get("/api/jobs", params=params)
            assert refused.status_code == 400 and message in refused.json()["error"], refused.text
            assert message in html.unescape(web.get("/jobs", params=params).text)  # in place on the page


def test_bulk_actions_take_the_search_filter_and_count_first(stack):
    dispatcher, client, _ = stack
    dead = dead_job(client, "final.bulk")
    with dashboard_client(dispatcher.target) as web:
        token = csrf_of(web.get("/jobs").text)
        dry = web.post(
            "/api/jobs/bulk",
            data={
                "csrf": token,
                "action": "requeue",
                "status": "dead",
                "type": "final.bulk",
                "dry_run": "true",
            },
        )
        counted = {"action": "requeue", "dry_run": True, "matched": 1, "touched": 0, "more": False}
        assert counted.items() <= dry.json().items()
        done = web.post(
            "/api/jobs/bulk", data={"csrf": token, "action": "requeue", "type": "final.bu*", "status": "dead"}
        )
        assert done.json()["touched"] == 1
        wait_until(lambda: client.get_job(dead).attempts == 2, 20)
        bad = web.post("/api/jobs/bulk", data={"csrf": token, "action": "explode"})
        assert bad.status_code == 400 and "action: one of" in bad.json()["error"]


def test_bad_input_gets_a_4xx_with_a_message_and_changes_nothing(stack):
    dispatcher, client, ids = stack
    with dashboard_client(dispatcher.target) as web:
        token = csrf_of(web.get("/").text)
        headers = {"X-CSRF-Token": token}
        cases = [
            (web.get("/api/dead", params={"reason": "bogus"}), 400, "reason: one of"),
            (web.get("/api/dead", params={"limit": "0"}), 400, "limit: 1..500"),
            (web.get("/api/dead", params={"limit": "many"}), 400, "limit: a whole number"),
            (web.get("/api/dead", params={"type": "bad type!"}), 400, "type: not a job type"),
            (web.get("/api/jobs/no!such"), 400, "job_id: not a job id"),
            (web.get("/api/jobs/0000000000000000000000"), 404, ""),
            (web.get("/api/overview/stream", params={"every_ms": "5"}), 400, "every_ms: 1000..60000"),
            (
                web.post("/api/queues/noop.ok/pause", headers=headers, data={"priority": "urgent"}),
                400,
                "priority: one of",
            ),
            (web.post("/api/schedules/no.such/pause", headers=headers), 404, "no schedule no.such"),
            (
                web.post(
                    "/api/queues/noop.ok/pause",
                    headers={**headers, "content-type": "application/json"},
                    content=b"[1]",
                ),
                400,
                "a JSON object",
            ),  # fmt: skip
            (
                web.post(
                    "/api/queues/noop.ok/pause",
                    headers={**headers, "content-type": "application/json"},
                    content=b"{",
                ),
                400,
                "not JSON",
            ),  # fmt: skip
            (
                web.post("/api/queues/noop.ok/pause", headers=headers, data={"x": "y" * 70_000}),
                413,
                "at most",
            ),
        ]
        for response, status, message in cases:
            assert response.status_code == status, response.text
            assert message in response.json()["error"], response.text
        assert not client.get_queue("noop.ok").settings.paused
        # Through htmx, the error is a fragment shown in place of the outcome.
        fragment = web.post("/api/schedules/no.such/run", headers={**headers, "HX-Request": "true"})
        assert fragment.status_code == 404 and 'class="flash error"' in fragment.text
        # A page whose read fails shows the message inside the page.
        page = web.get("/dead?reason=bogus")
        assert page.status_code == 200 and "reason: one of" in page.text and "Dead letters" in page.text
        missing = web.get("/jobs/0000000000000000000000")
        assert missing.status_code == 200 and "no job" in missing.text


def test_a_dispatcher_that_is_down_shows_a_message_not_a_blank_page(tmp_path):
    from tests.support.ports import free_port

    with dashboard_client(f"127.0.0.1:{free_port()}") as web:
        page = web.get("/")
        assert page.status_code == 503 and 'class="flash error"' in page.text
        assert web.get("/api/queues").status_code == 503


def test_without_auth_a_non_loopback_dashboard_refuses_to_serve(stack):
    dispatcher, _, _ = stack
    with dashboard_client(dispatcher.target, listen="0.0.0.0:7080") as web:
        page = web.get("/")
        assert page.status_code == 403 and "loopback only" in page.text
        assert web.get("/api/queues").status_code == 403
    with dashboard_client(dispatcher.target, listen="0.0.0.0:7080", allow_open=True) as web:
        assert web.get("/").status_code == 200


def test_the_job_page_shows_its_workflow(stack):
    dispatcher, client, _ = stack
    # Types no worker serves: the graph stays as enqueued.
    first, waiting = client.enqueue_many(
        [{"type": "unserved.first", "ref": "a"}, {"type": "unserved.then", "depends_on": [("a", "ignore")]}]
    )
    with dashboard_client(dispatcher.target) as web:
        page = web.get(f"/jobs/{waiting}").text
        assert "<h2>Workflow</h2>" in page and "waiting for 1 of 1 dependencies" in page
        assert f'<a href="/jobs/{first}">{first}</a>' in page and "<td>ignore</td>" in page
        assert 'hx-trigger="every 2s"' in page  # a waiting job's part refreshes itself
        dependency = web.get(f"/jobs/{first}").text
        assert "Waited for by" in dependency and waiting in dependency

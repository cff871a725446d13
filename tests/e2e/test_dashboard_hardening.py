"""The dashboard against the attacks a security review found: DNS rebinding and cross-site writes,
bearer tokens without auth, filters smuggled into action buttons, client eviction, unbounded streams,
scope leaks and bad input. Real dispatcher, Redis and database (both backends)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
from urllib.parse import quote

import grpc
import pytest
import structlog

from dispatcher.dashboard import gateway as gateway_module
from dispatcher.dashboard import serve
from dispatcher.dashboard import web as web_module
from dispatcher.dashboard.gateway import Gateway
from dispatcher.dashboard.settings import DashboardSettings
from dispatcher.dashboard.web import MAX_REFUSED_TOKENS, MAX_STREAMS_PER_SESSION
from shardq_common.errors import ConfigError
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity
from tests.deploy.test_helm_chart import MINIMAL, _merge, helm  # noqa: F401
from tests.e2e.conftest import TEST_SETTINGS
from tests.e2e.test_dashboard_auth import ADMIN, BILLING_VIEWER, secured, sign_in  # noqa: F401
from tests.support.dashboard import csrf_of, dashboard_client
from tests.support.ports import free_port
from tests.support.processes import DispatcherProcess
from tests.support.wait import wait_until
from worker_sdk import Client


def test_a_rebound_host_name_is_refused_and_cross_site_writes_too(dispatcher):
    with dashboard_client(dispatcher.target) as web, Client(dispatcher.target, timeout=10) as client:
        rebound = web.get("http://attacker.example/queues")
        assert rebound.status_code == 400 and "csrf" not in rebound.text.lower()
        for host in ("127.0.0.1", "localhost", "[::1]"):
            assert web.get(f"http://{host}:7080/queues").status_code == 200, host
        token = csrf_of(web.get("/queues").text)
        for headers in (
            {"Origin": "http://attacker.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
        ):
            refused = web.post("/api/queues/noop.ok/pause", data={"csrf": token}, headers=headers)
            assert refused.status_code == 403 and "another site" in refused.json()["error"], headers
        assert not client.get_queue("noop.ok").settings.paused
        same = {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}
        assert web.post("/api/queues/noop.ok/pause", data={"csrf": token}, headers=same).status_code == 200
        assert client.get_queue("noop.ok").settings.paused
    with dashboard_client(dispatcher.target, allowed_hosts=("shardq.example.com",)) as web:
        assert web.get("http://shardq.example.com/queues").status_code == 200
        assert web.get("/queues").status_code == 400
    with pytest.raises(ConfigError, match="ALLOWED_HOSTS"):
        DashboardSettings(allowed_hosts=("a.*.com",)).check()


def test_without_auth_a_bearer_token_does_not_open_a_non_loopback_dashboard(dispatcher):
    with dashboard_client(dispatcher.target, listen="0.0.0.0:7080") as web:
        bearer = {"Authorization": "Bearer anything-at-all"}
        refused = web.post("/api/queues/noop.ok/pause", headers=bearer)
        assert refused.status_code == 403 and "loopback only" in refused.json()["error"]
        assert web.get("/api/queues", headers=bearer).status_code == 403
    with Client(dispatcher.target, timeout=10) as client:
        assert not client.get_queue("noop.ok").settings.paused


def test_a_non_loopback_start_is_refused_when_the_dispatcher_does_not_answer(monkeypatch):
    monkeypatch.setattr(serve, "PROBE_S", 1.0)

    async def check(listen: str, allow_open: bool = False) -> bool | None:
        gateway = Gateway(f"127.0.0.1:{free_port()}")
        try:
            settings = DashboardSettings(listen=listen, allow_open=allow_open)
            return await serve.check_exposure(settings, gateway)
        finally:
            await gateway.close()

    with pytest.raises(ConfigError, match="did not say whether it checks tokens"):
        asyncio.run(check("0.0.0.0:7080"))
    assert asyncio.run(check("0.0.0.0:7080", allow_open=True)) is None
    assert asyncio.run(check("127.0.0.1:7080")) is None


def _hx_vals(page: str, action: str) -> list[dict[str, str]]:
    """The JSON of every hx-vals on the buttons that post to ``action``."""
    found = re.findall(rf'hx-post="{re.escape(action)}" hx-vals=\'([^\']*)\'', page)
    return [json.loads(html.unescape(v)) for v in found]


def test_the_dead_letter_buttons_carry_the_filter_as_json_and_none_for_a_bad_filter(dispatcher):
    with dashboard_client(dispatcher.target) as web:
        smuggled = web.get("/dead", params={"type": 'billing.x", "type": "'})
        assert "type: not a job type" in html.unescape(smuggled.text)
        assert "/api/dead/purge" not in smuggled.text and "/api/dead/requeue" not in smuggled.text
        page = web.get("/dead", params={"type": "billing.x", "reason": "lease_expired"}).text
        assert _hx_vals(page, "/api/dead/purge") == [{"type": "billing.x", "reason": "lease_expired"}]
        assert {"type": "billing.x", "reason": "lease_expired", "dry_run": "true"} in _hx_vals(
            page, "/api/dead/requeue"
        )


def test_bulk_buttons_send_the_search_shown_and_an_empty_filter_needs_all(dispatcher):
    with Client(dispatcher.target, timeout=10) as client:
        kept = client.enqueue("keep.me", {}, delay=3600)
        with dashboard_client(dispatcher.target) as web:
            page = web.get("/jobs", params={"type": "final.*", "status": "dead"}).text
            sent = _hx_vals(page, "/api/jobs/bulk")
            assert len(sent) == 2 and all(v["type"] == "final.*" and v["status"] == "dead" for v in sent)
            assert all(v["payload"] == "" and "all" not in v for v in sent)  # edits to the form do not count
            assert "Apply to 0 jobs the search selects?" in html.unescape(page)
            token = csrf_of(page)
            refused = web.post("/api/jobs/bulk", data={"csrf": token, "action": "delete"})
            assert refused.status_code == 400 and "all=true" in refused.json()["error"]
            assert client.get_job(kept).status == "delayed"
            everything = web.get("/jobs").text
            assert all(v.get("all") == "true" for v in _hx_vals(everything, "/api/jobs/bulk"))
            assert "No filter: apply to EVERY job" in html.unescape(everything)


def test_unknown_tokens_take_no_kept_client_and_an_address_that_guesses_is_slowed(secured):  # noqa: F811
    dispatcher, _, _ = secured
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, ADMIN)
        assert web.get("/api/me").json()["name"] == "ops"
        kept = len(web.app.state.dashboard.gateway._clients)
        with structlog.testing.capture_logs() as logs:
            for n in range(MAX_REFUSED_TOKENS):
                guess = {"Authorization": f"Bearer guess-{n:04d}-0123456789"}
                assert web.post("/api/queues/email.send/pause", headers=guess).status_code == 401
        assert len(web.app.state.dashboard.gateway._clients) == kept
        refusals = [e for e in logs if e["event"] == "dashboard token refused"]
        assert len(refusals) == MAX_REFUSED_TOKENS and refusals[0]["remote"] == "testclient"
        assert all("guess-" not in str(e) for e in logs)  # never the token
        slowed = web.get("/api/me", headers={"Authorization": "Bearer guess-again-0123456789"})
        assert slowed.status_code == 429 and "wait a minute" in slowed.json()["error"]
        assert web.get("/api/me").json()["name"] == "ops"  # the signed-in session goes on
        form = web.get("/signin").text
        refused = web.post("/signin", data={"csrf": csrf_of(form), "token": "guess-more-0123456789"})
        assert refused.status_code == 429


def test_a_client_pushed_out_of_the_cache_finishes_its_calls(secured, monkeypatch):  # noqa: F811
    dispatcher, _, _ = secured
    monkeypatch.setattr(gateway_module, "MAX_CLIENTS", 1)

    async def scenario() -> str:
        gateway = Gateway(dispatcher.target)
        try:
            admin = gateway.client(ADMIN)
            gateway.client(BILLING_VIEWER)  # pushes the admin's client out
            await asyncio.sleep(0.2)
            return (await admin.whoami()).name
        finally:
            await gateway.close()

    assert asyncio.run(scenario()) == "ops"


def test_live_streams_are_bounded_in_pace_and_number(dispatcher, monkeypatch):
    with dashboard_client(dispatcher.target) as web, contextlib.ExitStack() as held:
        fast = web.get("/api/overview/stream", params={"every_ms": "500"})
        assert fast.status_code == 400 and "every_ms: 1000..60000" in fast.json()["error"]
        streams = [
            held.enter_context(web.stream("GET", path))
            for path in ("/api/overview/stream", "/queues/stream", "/api/overview/stream", "/queues/stream")
        ]
        assert [s.status_code for s in streams] == [200] * MAX_STREAMS_PER_SESSION
        over = web.get("/queues/stream")
        assert over.status_code == 429 and "per session" in over.json()["error"]
        streams[0].close()
        wait_until(lambda: web.get("/api/overview/stream", params={"count": "1"}).status_code == 200, 10)
        monkeypatch.setattr(web_module, "MAX_STREAMS", MAX_STREAMS_PER_SESSION - 1)  # the 3 held fill it
        full = web.get("/api/overview/stream", params={"count": "1"})
        assert full.status_code == 429 and "live streams at most" in full.json()["error"]


SCOPED_VIEWER = "final-b-viewer-0123456789"


@pytest.fixture
def scoped_dead(redis_url, db_url, tmp_path, start_worker, monkeypatch):
    """A dispatcher with auth: 3 dead jobs of final.a (older), then 3 of final.b; a viewer scoped to
    final.b and its schedule, and another schedule outside its scope."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(
        f"{ADMIN} role=admin name=ops\n{SCOPED_VIEWER} role=viewer types=final.b name=b-oncall\n"
    )
    security = ChannelSecurity.resolve(token=ADMIN, env={})
    dispatcher = DispatcherProcess(
        redis_url, db_url, tmp_path, security=security, **{**TEST_SETTINGS, "auth_tokens_file": tokens}
    )
    try:
        dispatcher.start()
        monkeypatch.setenv("SHARDQ_TOKEN", ADMIN)
        start_worker(dispatcher.target, types="final.a,final.b")
        with Client(dispatcher.target, token=ADMIN, timeout=10) as admin:
            outside = [admin.enqueue("final.a", {"n": n}) for n in range(3)]
            wait_until(lambda: all(admin.get_job(j).status == "dead" for j in outside), 20)
            inside = [admin.enqueue("final.b", {"n": n}) for n in range(3)]
            wait_until(lambda: all(admin.get_job(j).status == "dead" for j in inside), 20)
            for name, job_type in (("b.nightly", "final.b"), ("a.nightly", "final.a")):
                admin.upsert_schedule(name=name, cron="0 3 * * *", job_type=job_type)
            yield dispatcher, admin, outside, inside
    finally:
        dispatcher.kill()


def test_a_scoped_viewer_pages_through_its_dead_jobs_and_counts_them(scoped_dead):
    dispatcher, _, outside, inside = scoped_dead
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, SCOPED_VIEWER)
        first = web.get("/api/dead", params={"limit": 2}).json()
        assert [j["id"] for j in first["jobs"]] == sorted(inside)[:2] and first["next_after"]
        rest = web.get("/api/dead", params={"limit": 2, "after": first["next_after"]}).json()
        assert [j["id"] for j in rest["jobs"]] == sorted(inside)[2:]
        assert web.get("/api/dead/count").json() == {"count": 3, "at_least": False}
        assert web.get("/api/dead/count", params={"reason": "not_retryable"}).json()["count"] == 3


def test_a_scoped_viewer_sees_neither_other_schedules_nor_other_jobs_types(scoped_dead):
    dispatcher, _, outside, _ = scoped_dead
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, SCOPED_VIEWER)
        other = web.get(f"/api/jobs/{outside[0]}")
        assert other.status_code == 404 and other.json()["error"] == f"no job {outside[0]}"
        page = web.get(f"/jobs/{outside[0]}").text
        assert "final.a" not in page and f"no job {outside[0]}" in page
    with grpc.insecure_channel(dispatcher.target) as channel:
        stats = pb_grpc.JobServiceStub(channel).Stats(
            pb.StatsRequest(), metadata=(("authorization", f"Bearer {SCOPED_VIEWER}"),), timeout=10
        )
        assert [s.name for s in stats.schedules] == ["b.nightly"]
    with dashboard_client(dispatcher.target) as web:  # the cluster-wide figures say so
        sign_in(web, SCOPED_VIEWER)
        assert "whatever your scope" in web.get("/").text
        assert "whatever your scope" in web.get("/workers").text


def _chunked(data: bytes):
    """A body sent without Content-Length (Transfer-Encoding: chunked)."""
    yield data[: len(data) // 2]
    yield data[len(data) // 2 :]


def test_bad_input_gets_a_4xx_with_a_message_not_a_500(dispatcher):
    with dashboard_client(dispatcher.target) as web, Client(dispatcher.target, timeout=10) as client:
        token = csrf_of(web.get("/queues").text)
        json_headers = {"X-CSRF-Token": token, "content-type": "application/json"}
        deep = web.post("/api/queues/noop.ok/pause", headers=json_headers, content=b"[" * 30_000)
        assert deep.status_code == 400 and "not JSON" in deep.json()["error"]
        for moment in ("inf", "-inf", "nan", "1e300", "-5"):
            bad = web.get("/api/jobs", params={"created_after": moment})
            assert bad.status_code == 400 and "created_after: a moment" in bad.json()["error"], moment
        boundary = "b0undary"
        field = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="token"\r\n\r\n'.encode()
            + b"x" * 70_000
            + f"\r\n--{boundary}--\r\n".encode()
        )
        multipart = {"content-type": f"multipart/form-data; boundary={boundary}"}
        for path in ("/signin", "/signout", "/api/queues/noop.ok/pause"):
            big = web.post(path, headers={**multipart, "X-CSRF-Token": token}, content=_chunked(field))
            assert big.status_code == 413 and "at most 65536 bytes" in big.text, (path, big.text)
        signout = web.post("/signout", headers=json_headers, content=b"{")
        assert signout.status_code == 400 and "not JSON" in signout.json()["error"]
        in_url = web.post(f"/api/queues/noop.ok/pause?csrf={token}")
        assert in_url.status_code == 403 and "CSRF" in in_url.json()["error"]
        assert not client.get_queue("noop.ok").settings.paused


def test_sign_ins_sign_outs_and_refused_tokens_are_logged_with_the_address_never_the_token(secured):  # noqa: F811
    dispatcher, _, _ = secured
    with dashboard_client(dispatcher.target) as web, structlog.testing.capture_logs() as logs:
        sign_in(web, "made-up-token-0123456789", expect=401)
        sign_in(web, ADMIN)
        web.post("/signout", data={"csrf": csrf_of(web.get("/queues").text)})
    events = {e["event"]: e for e in logs}
    assert events["dashboard token refused"]["how"] == "sign-in"
    assert events["dashboard sign-in"]["user"] == "ops"
    assert events["dashboard sign-out"]["user"] == "ops"
    for name in ("dashboard token refused", "dashboard sign-in", "dashboard sign-out"):
        assert events[name]["remote"] == "testclient", name
    assert not any("made-up-token" in str(e) or ADMIN in str(e) for e in logs)


def test_a_shared_link_keeps_its_query_and_never_signs_the_user_out(secured):  # noqa: F811
    dispatcher, _, _ = secured
    with dashboard_client(dispatcher.target) as web:
        wanted = "/jobs?type=billing.*&status=dead"
        away = web.get(wanted)
        assert away.headers["location"] == "/signin?next=" + quote(wanted, safe="")
        form = web.get(away.headers["location"]).text
        assert f'name="next" value="{html.escape(wanted)}"' in form
        reply = web.post("/signin", data={"csrf": csrf_of(form), "token": ADMIN, "next": wanted})
        assert reply.headers["location"] == wanted
        # Showing the sign-in form again (a link followed while the cookie was held back) leaves
        # the session as it is.
        assert web.get("/signin").status_code == 200
        assert web.get("/api/me").json()["name"] == "ops"
        # A navigation from another site without the cookie gets a page that loads itself again.
        session_cookies = dict(web.cookies)
        web.cookies.clear()
        cross = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        held_back = web.get(wanted, headers=cross)
        assert held_back.status_code == 200 and '<meta http-equiv="refresh" content="0">' in held_back.text
        assert web.get(wanted, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 303
        web.cookies.update(session_cookies)
        assert web.get(wanted, headers=cross).status_code == 200 and "Jobs" in web.get(wanted).text


def test_the_chart_refuses_dashboard_replicas_without_a_shared_session_secret(helm):  # noqa: F811
    several = _merge(MINIMAL, {"dashboard": {"enabled": True, "allowOpen": True, "replicas": 2}})
    proc = helm.template(several)
    assert proc.returncode != 0 and "needs dashboard.sessionSecret.name" in proc.stderr, proc.stderr
    shared = _merge(several, {"dashboard": {"sessionSecret": {"name": "dashboard-session"}}})
    assert helm.template(shared).returncode == 0
    assert helm.template(_merge(several, {"dashboard": {"replicas": 1}})).returncode == 0

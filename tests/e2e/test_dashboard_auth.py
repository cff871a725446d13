"""The dashboard in front of a dispatcher that checks tokens: sign-in into a sealed session cookie,
the viewer role (reads, no actions), type scopes, CSRF, bearer tokens for scripts, and the rule that
without auth it serves loopback only. Real dispatcher, Redis and database (both backends)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import subprocess
import sys

import pytest
import structlog

from dispatcher.dashboard.gateway import Gateway
from dispatcher.dashboard.serve import check_exposure
from dispatcher.dashboard.sessions import COOKIE
from dispatcher.dashboard.settings import DashboardSettings
from shardq_common.errors import ConfigError
from shardq_common.tls import ChannelSecurity
from tests.e2e.conftest import TEST_SETTINGS
from tests.support.dashboard import csrf_of, dashboard_client
from tests.support.processes import DispatcherProcess
from tests.support.redis_server import RedisServer
from worker_sdk import Client

ADMIN = "admin-token-0123456789"
VIEWER = "viewer-token-0123456789"
BILLING_VIEWER = "billing-viewer-0123456789"
PRODUCER = "producer-token-0123456789"


@pytest.fixture(scope="module")
def secured(module_db_url, tmp_path_factory):
    """One dispatcher that checks tokens per database backend, on a Redis of its own, shared by the
    module's tests (each test changes only what no other test looks at)."""
    root = tmp_path_factory.mktemp("dashboard-auth")
    db_url = module_db_url
    with contextlib.ExitStack() as stack:
        redis = RedisServer(root / "redis")
        redis.start()
        stack.callback(redis.stop)
        tokens = root / "tokens.txt"
        tokens.write_text(
            f"sha256:{hashlib.sha256(ADMIN.encode()).hexdigest()} role=admin name=ops\n"
            f"{VIEWER} role=viewer name=watcher\n"
            f"{BILLING_VIEWER} role=viewer types=billing.* name=billing-oncall\n"
            f"{PRODUCER} role=producer name=app\n"
        )
        security = ChannelSecurity.resolve(token=ADMIN, env={})
        settings = {**TEST_SETTINGS, "auth_tokens_file": tokens}
        dispatcher = DispatcherProcess(redis.url, db_url, root, security=security, **settings)
        stack.callback(dispatcher.kill)
        dispatcher.start()
        admin = stack.enter_context(Client(dispatcher.target, token=ADMIN, timeout=10))
        ids = {
            "billing": admin.enqueue("billing.charge", {"amount": 5}),
            "email": admin.enqueue("email.send", {"to": "a@b.c"}),
        }
        yield dispatcher, admin, ids


def sign_in(web, token: str, expect: int = 303):
    form = web.get("/signin").text
    reply = web.post("/signin", data={"csrf": csrf_of(form), "token": token, "next": "/queues"})
    assert reply.status_code == expect, reply.text
    return reply


def test_without_a_session_pages_send_to_sign_in_and_the_api_answers_401(secured):
    dispatcher, _, ids = secured
    with dashboard_client(dispatcher.target) as web:
        for path in ("/", "/queues", "/jobs", f"/jobs/{ids['billing']}", "/dead", "/schedules", "/workers"):
            page = web.get(path)
            assert page.status_code == 303 and page.headers["location"].startswith("/signin"), path
        assert web.get("/api/queues").status_code == 401
        assert web.post("/api/queues/billing.charge/pause").status_code == 401
        # A forged or altered cookie is no session.
        web.cookies.set(COOKIE, "A" * 200)
        assert web.get("/").status_code == 303


def test_sign_in_sets_a_sealed_strict_http_only_cookie_and_a_bad_token_is_refused_in_place(secured):
    dispatcher, _, _ = secured
    with dashboard_client(dispatcher.target, session_s=60) as web:
        bad = sign_in(web, "not-a-token-0000000000", expect=401)
        assert "this token is not known" in bad.text and 'name="token"' in bad.text
        form = web.get("/signin").text
        no_csrf = web.post("/signin", data={"token": VIEWER, "csrf": "wrong"})
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text and "signin" in form
        reply = sign_in(web, VIEWER)
        assert reply.headers["location"] == "/queues"
        cookie = reply.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=60" in cookie
        assert "Secure" not in cookie  # plain http here; over https the cookie is Secure
        assert VIEWER not in cookie  # the token inside is encrypted
        assert web.get("/api/me").json() == {
            "name": "watcher",
            "role": "viewer",
            "types": [],
            "may_act": False,
        }
        page = web.get("/queues").text
        signout = web.post("/signout", data={"csrf": csrf_of(page)})
        assert signout.status_code == 303
        assert web.get("/").status_code == 303
    with dashboard_client(dispatcher.target, scheme="https") as web:
        assert "Secure" in sign_in(web, VIEWER).headers["set-cookie"]
        assert web.get("/api/me").json()["name"] == "watcher"


def test_a_viewer_reads_everything_and_is_refused_every_action(secured):
    dispatcher, admin, ids = secured
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, VIEWER)
        for path in ("/", "/queues", "/jobs", f"/jobs/{ids['email']}", "/dead", "/schedules", "/workers"):
            page = web.get(path)
            assert page.status_code == 200 and 'class="flash error"' not in page.text, (path, page.text)
        assert "hx-post" not in web.get("/queues").text  # no action buttons for a viewer
        token = csrf_of(web.get("/queues").text)
        for path in ("/api/queues/report.daily/pause", f"/api/jobs/{ids['email']}/cancel", "/api/dead/purge",
                     "/api/shards/rebalance"):  # fmt: skip
            refused = web.post(path, data={"csrf": token})
            assert refused.status_code == 403 and "role viewer" in refused.json()["error"], path
        assert not admin.get_queue("report.daily").settings.paused
        assert admin.get_job(ids["email"]).status != "cancelled"


def test_a_scoped_viewer_sees_only_its_types(secured):
    dispatcher, admin, ids = secured
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, BILLING_VIEWER)
        assert {q["type"] for q in web.get("/api/queues").json()["queues"]} == {"billing.charge"}
        assert web.get(f"/api/jobs/{ids['billing']}").status_code == 200
        other = web.get(f"/api/jobs/{ids['email']}")
        assert other.status_code == 404 and "email" not in other.json()["error"]
        assert [j["id"] for j in web.get("/api/jobs").json()["jobs"]] == [ids["billing"]]
        assert web.get("/api/jobs", params={"type": "email.send"}).json()["jobs"] == []
        assert "email.send" not in web.get("/queues").text
        assert web.get("/api/dead", params={"type": "email.send"}).status_code == 403


def test_an_admin_acts_with_the_csrf_token_and_the_action_is_logged_with_its_name(secured):
    dispatcher, admin, ids = secured
    with dashboard_client(dispatcher.target) as web:
        sign_in(web, ADMIN)
        assert web.post("/api/queues/email.send/pause").status_code == 403  # no CSRF token
        token = csrf_of(web.get("/queues").text)
        with structlog.testing.capture_logs() as logs:
            reply = web.post("/api/queues/email.send/pause", data={"csrf": token})
        assert reply.status_code == 200 and admin.get_queue("email.send").paused
        assert {"action": "pause queue", "user": "ops", "role": "admin", "outcome": "done"}.items() <= logs[
            -1
        ].items()
        # Another session's CSRF token is refused.
        with dashboard_client(dispatcher.target) as other:
            sign_in(other, ADMIN)
            assert other.post("/api/queues/email.send/resume", data={"csrf": token}).status_code == 403


def test_scripts_use_a_bearer_token_without_csrf_and_keep_its_role(secured):
    dispatcher, admin, _ = secured
    with dashboard_client(dispatcher.target) as web:
        viewer = {"Authorization": f"Bearer {VIEWER}"}
        assert web.get("/api/me", headers=viewer).json()["name"] == "watcher"
        assert web.post("/api/queues/email.send/pause", headers=viewer).status_code == 403
        ops = {"Authorization": f"Bearer {ADMIN}"}
        assert web.post("/api/queues/email.send/pause", headers=ops).json()["paused"]
        assert web.get("/api/me", headers={"Authorization": "Bearer nope-nope-nope-nope"}).status_code == 401
        # A producer may not read the operator's views.
        producer = {"Authorization": f"Bearer {PRODUCER}"}
        assert web.get("/api/dead", headers=producer).status_code == 403


def test_with_auth_on_a_non_loopback_listen_is_allowed(secured):
    dispatcher, _, _ = secured
    with dashboard_client(dispatcher.target, listen="0.0.0.0:7080") as web:
        assert web.get("/").status_code == 303  # to the sign-in, not refused


def test_without_auth_the_start_refuses_a_non_loopback_listen(start_dispatcher, redis_url, tmp_path):
    dispatcher = start_dispatcher(redis_url, f"sqlite:///{tmp_path}/shardq.sqlite3")

    async def check(listen: str, allow_open: bool = False) -> bool | None:
        gateway = Gateway(dispatcher.target)
        try:
            return await check_exposure(DashboardSettings(listen=listen, allow_open=allow_open), gateway)
        finally:
            await gateway.close()

    with pytest.raises(ConfigError, match="serves loopback only"):
        asyncio.run(check("0.0.0.0:7080"))
    assert asyncio.run(check("0.0.0.0:7080", allow_open=True)) is False
    assert asyncio.run(check("127.0.0.1:7080")) is False
    cli = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.daemon", "dashboard", "--listen", "0.0.0.0:0",
         "--target", dispatcher.target],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2 and "serves loopback only" in cli.stderr

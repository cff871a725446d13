"""The dashboard in a real browser (headless Chromium): the overview's chart updates by itself, a job
is found by a payload field and opened, a dead job is requeued from the dead-letter page and runs,
a queue is paused. A screenshot of each page goes to the test's tmp folder (screenshots/)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.browser import chromium
from tests.support.ports import free_port
from tests.support.wait import wait_until
from worker_sdk import Client

TYPES = "noop.ok,flaky.once"


@pytest.fixture
def dashboard(start_dispatcher, start_worker, redis_url, tmp_path):
    """A dispatcher (SQLite), a worker, and ``dispatcher dashboard`` as a child process."""
    dispatcher = start_dispatcher(redis_url, f"sqlite:///{tmp_path}/shardq.sqlite3")
    start_worker(dispatcher.target, types=TYPES)
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.daemon", "dashboard", "--listen", f"127.0.0.1:{port}",
         "--target", dispatcher.target],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    log.close()
    try:
        wait_until(
            lambda: b"dashboard: http" in (tmp_path / "dashboard.log").read_bytes() or process.poll(), 30
        )
        assert process.poll() is None, (tmp_path / "dashboard.log").read_text()
        with Client(dispatcher.target, timeout=10) as client:
            yield f"http://127.0.0.1:{port}", client
    finally:
        process.terminate()
        process.wait(10)


def test_the_dashboard_in_a_real_browser(dashboard, tmp_path):
    url, client = dashboard
    shots = tmp_path / "screenshots"
    shots.mkdir()
    found = client.enqueue("noop.ok", {"customer_id": 4242, "plan": "pro"})
    client.enqueue("noop.ok", {"customer_id": 7})
    dead = client.enqueue("flaky.once", {"fail_times": 1}, max_attempts=1)
    wait_until(lambda: client.get_job(found).status == "succeeded", 20)
    wait_until(lambda: client.get_job(dead).status == "dead", 20)
    problems: list[str] = []
    with chromium() as browser:
        from playwright.sync_api import expect

        page = browser.new_page(viewport={"width": 1280, "height": 900})
        # A CSP violation or a script error shows in the console: there must be none.
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))

        # Overview: the chart gets points from the live stream, without a reload.
        page.goto(url + "/")
        # Waits read the page through selectors: a page script (wait_for_function) would be an eval,
        # which the dashboard's CSP refuses.
        page.wait_for_selector("body[data-samples='3']", state="attached", timeout=15_000)
        assert page.locator("#chart-rates canvas").count() == 1
        client.enqueue_many([{"type": "noop.ok", "payload": {"i": i}} for i in range(10)])
        expect(page.locator("#rate-succeeded")).to_have_text(re.compile(r"^(?!0$)\d"), timeout=15_000)
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        # Jobs: search by a payload field; the filters land in the URL; open the job.
        page.goto(url + "/jobs")
        page.fill("input[name=payload]", "customer_id = 4242")
        page.click("#search-form button:text('Search')")
        page.wait_for_url(re.compile(r"payload=customer_id"))
        rows = page.locator("table.jobs tbody tr")
        assert rows.count() == 1 and found in rows.first.inner_text()
        page.screenshot(path=str(shots / "jobs.png"), full_page=True)
        page.click(f"a[href='/jobs/{found}']")
        page.wait_for_selector("#job-status")
        assert page.inner_text("#job-status") == "succeeded" and '"plan": "pro"' in page.inner_text(
            "pre.payload"
        )
        page.screenshot(path=str(shots / "job.png"), full_page=True)

        # Dead letters: requeue the dead job; it runs (its second attempt succeeds).
        page.goto(url + "/dead")
        page.click(f"tr[data-id='{dead}'] button:text('Requeue')")
        page.wait_for_selector(f"tr[data-id='{dead}'] .flash.ok")
        page.screenshot(path=str(shots / "dead.png"), full_page=True)
        wait_until(lambda: client.get_job(dead).status == "succeeded", 20)
        page.goto(url + f"/jobs/{dead}")
        assert page.inner_text("#job-status") == "succeeded"

        # Queues: pause one; the live table says so.
        page.goto(url + "/queues")
        page.click("tr[data-type='noop.ok'] button:text('Pause')")
        page.wait_for_selector("#queue-outcome .flash.ok")
        assert client.get_queue("noop.ok").paused
        page.wait_for_selector("tr[data-type='noop.ok'] td.state:text('paused')", timeout=10_000)
        page.screenshot(path=str(shots / "queues.png"), full_page=True)

        for name in ("schedules", "workers"):
            page.goto(url + f"/{name}")
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        assert "noop.ok" in page.inner_text("table.workers")
    assert not problems, problems
    assert sorted(p.name for p in shots.iterdir()) == sorted(
        f"{n}.png" for n in ("overview", "jobs", "job", "dead", "queues", "schedules", "workers")
    )

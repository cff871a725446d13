"""The dashboard served for real: beside a dispatcher (SHARDQ_DASHBOARD_LISTEN) and by
``dispatcher demo --dashboard``, which keeps running after its summary until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.wait import wait_until


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None


@pytest.mark.parametrize("processes", [1, 2])
def test_a_dispatcher_serves_the_dashboard_at_shardq_dashboard_listen(
    start_dispatcher, redis_url, tmp_path, processes
):
    """One process serves it beside itself; a supervisor serves one for its children (not each
    child: they share its environment), summing every child's counters."""
    port = free_port()
    dispatcher = start_dispatcher(
        redis_url,
        f"sqlite:///{tmp_path}/shardq.sqlite3",
        dashboard_listen=f"127.0.0.1:{port}",
        processes=processes,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: (r := _get(base + "/healthz")) is not None and r.status_code == 200, 20)
    assert httpx.get(base + "/api/me").json()["role"] == "admin"
    overview = httpx.get(base + "/api/overview").json()
    if processes > 1:  # the members' counters are read once the shard map lists them all
        wait_until(lambda: httpx.get(base + "/api/overview").json()["processes"] == processes, 20, 0.5)
        overview = httpx.get(base + "/api/overview").json()
    assert overview["processes"] == processes and set(overview["depth"]) == {
        "delayed",
        "ready",
        "leased",
        "dead",
    }
    dispatcher.signal(signal.SIGTERM)
    assert dispatcher.process is not None and dispatcher.process.wait(30) == 0
    assert _get(base + "/healthz") is None


def test_the_demo_keeps_its_dispatcher_and_a_dashboard_running_after_the_summary(tmp_path):
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.daemon", "demo", "--jobs", "8", "--dashboard",
         "--dashboard-listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_until(
            lambda: any(line.startswith("dashboard: http") for line in lines), 90, 0.1, lambda: "".join(lines)
        )
        assert any("demo finished: every job accounted for" in line for line in lines)
        url = next(line for line in lines if line.startswith("dashboard: ")).split()[1]
        assert url == f"http://127.0.0.1:{port}/"
        found = httpx.get(url + "api/jobs", params={"type": "resize"}).json()["jobs"]
        assert len(found) == 4 and {j["status"] for j in found} == {"succeeded"}
        assert "Overview" in httpx.get(url).text
        demo.send_signal(signal.SIGINT)
        assert demo.wait(30) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        reader.join(10)
        assert demo.stdout is not None
        demo.stdout.close()

"""``dispatcher demo-worker`` (the Helm chart's development profile runs it) against a real dispatcher."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.support.processes import _env
from tests.support.wait import wait_until
from worker_sdk import Client

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_demo_worker_runs_the_demonstration_handlers(dispatcher, tmp_path):
    log = open(tmp_path / "demo-worker.log", "wb")  # noqa: SIM115 - the child writes it
    # As the chart runs it: the target from SHARDQ_TARGET, the concurrency as an argument.
    worker = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.daemon", "demo-worker", "--concurrency", "4"],
        env=_env({"SHARDQ_TARGET": dispatcher.target}),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        with Client(dispatcher.target) as client:
            echo = client.enqueue("demo.echo", {"hello": "shardq"})
            slept = client.enqueue("demo.sleep", {"seconds": 0.2})
            flaky = client.enqueue("demo.flaky", {"succeed_on": 2}, max_attempts=3)
            fail = client.enqueue("demo.fail", None)
            wait_until(lambda: client.get_job(echo).status == "succeeded", timeout=15)
            assert client.get_job(echo).result == b'{"hello": "shardq"}'
            wait_until(lambda: client.get_job(slept).status == "succeeded", timeout=15)
            wait_until(lambda: client.get_job(flaky).status == "succeeded", timeout=15)
            assert client.get_job(flaky).attempts == 2
            wait_until(lambda: client.get_job(fail).status == "dead", timeout=15)
            assert client.get_job(fail).dead_reason == "not_retryable"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0, (tmp_path / "demo-worker.log").read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

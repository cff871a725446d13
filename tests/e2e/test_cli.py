"""The command lines as an operator types them: options on either side of the subcommand, and a
start-up that cannot go on says why in one line and exits non-zero."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.ports import free_port
from tests.support.processes import ROOT
from worker_sdk import Client

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHARDQ_TARGET"}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_global_options_are_accepted_after_the_subcommand(dispatcher):
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("cli.after", {"n": 1}, delay=3600)

    stats = ctl("stats", "--json", "--target", dispatcher.target, "--timeout", "20")
    assert stats.returncode == 0, stats.stderr
    assert any(q["type"] == "cli.after" and q["delayed"] == 1 for q in json.loads(stats.stdout)["queues"])

    shown = ctl("--target", dispatcher.target, "job", "show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == job_id

    listed = ctl("schedule", "list", "--target", dispatcher.target, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []

    # Given on both sides, the one after the subcommand wins, as with kubectl.
    both = ctl("--target", "127.0.0.1:1", "stats", "--target", dispatcher.target, "--json")
    assert both.returncode == 0, both.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


START_FAILURES = {
    "metrics port taken": ({"SHARDQ_METRICS_LISTEN": "127.0.0.1:{taken}"}, "SHARDQ_METRICS_LISTEN"),
    "gRPC port taken": ({"SHARDQ_LISTEN": "127.0.0.1:{taken}"}, "SHARDQ_LISTEN"),
    "health port taken": ({"SHARDQ_HEALTH_LISTEN": "127.0.0.1:{taken}"}, "SHARDQ_HEALTH_LISTEN"),
    "Redis unreachable": ({"SHARDQ_REDIS_URL": "redis://127.0.0.1:{closed}"}, "SHARDQ_REDIS_URL"),
    "database unreachable": (
        {"SHARDQ_DB_URL": "postgresql://postgres@127.0.0.1:{closed}/shardq"},
        "SHARDQ_DB_URL",
    ),
    "certificate missing": ({"SHARDQ_TLS_CERT": "nowhere.pem", "SHARDQ_TLS_KEY": "nowhere.key"}, "TLS"),
}


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("case", sorted(START_FAILURES))
def test_a_start_that_cannot_go_on_says_why_in_one_line(case, processes, taken_port, db_url, tmp_path):
    settings, names = START_FAILURES[case]
    closed = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "SHARDQ_DB_URL": db_url,
            "SHARDQ_LISTEN": f"127.0.0.1:{free_port()}",
            "SHARDQ_METRICS_LISTEN": "",
            "SHARDQ_LOG_LEVEL": "warning",
        }
    )
    env.update({k: v.format(taken=taken_port, closed=closed) for k, v in settings.items()})
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.daemon", "run", "--processes", str(processes)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    reasons = [line for line in proc.stderr.splitlines() if line.startswith("dispatcher: ")]
    assert reasons, proc.stderr
    assert all(names in line for line in reasons), reasons

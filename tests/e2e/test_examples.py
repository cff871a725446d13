"""The examples in examples/ run as their README says, so they cannot rot: ``dispatcher run`` on its
embedded defaults (and on PostgreSQL for the transactional form), ``python examples/worker.py`` and
the FastAPI app under uvicorn, all real processes; a request to the app and the job it enqueues
running in the example worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support.ports import free_port
from tests.support.processes import ROOT, DispatcherProcess
from tests.support.wait import wait_until
from worker_sdk import Client

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


class Started:
    """Child processes with their output in a file each, killed at the end of the test."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Path:
        log = self.log_dir / f"{name}.log"
        # Only the settings given here: the examples run on their defaults, as a user's shell has them.
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "DATABASE_URL"))}
        clean["PYTHONPATH"] = str(ROOT) + os.pathsep + clean.get("PYTHONPATH", "")
        clean["PYTHONUNBUFFERED"] = "1"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, *args], env={**clean, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
            )
        self.children.append((proc, log))
        return log

    def check_alive(self) -> None:
        for proc, log in self.children:
            if proc.poll() is not None:
                raise AssertionError(f"{log.name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")

    def stop_all(self) -> None:
        for proc, _ in reversed(self.children):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    children = Started(tmp_path)
    yield children
    children.stop_all()


def answers(target: str) -> bool:
    try:
        with Client(target, timeout=0.5) as client:
            client.version()
        return True
    except Exception:
        return False


def start_app(started: Started, target: str, database_url: str = "") -> str:
    """The example app under uvicorn; returns its base URL once it answers."""
    port = free_port()
    env = {"SHARDQ_TARGET": target, **({"DATABASE_URL": database_url} if database_url else {})}
    started.start("app", ["-m", "uvicorn", "examples.app:app", "--port", str(port)], env)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        started.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base}/openapi.json", timeout=0.5).status_code == 200
        return False

    wait_until(up, timeout=30, interval=0.1, message="the example app never answered")
    return base


def wait_for_line(started: Started, log: Path, text: str, timeout: float = 20.0) -> None:
    def seen() -> bool:
        started.check_alive()
        return text in log.read_text()

    wait_until(seen, timeout=timeout, interval=0.05, message=lambda: f"{text!r} not in {log.name}")


def test_the_app_and_the_worker_run_against_dispatcher_run_on_its_embedded_defaults(
    started: Started, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{free_port()}"
    data_dir = tmp_path / "data"
    started.start(
        "dispatcher",
        ["-m", "dispatcher.cli.daemon", "run", "--listen", target],
        # A data folder of its own and no metrics port: several suites may run on this machine.
        {"SHARDQ_DATA_DIR": str(data_dir), "SHARDQ_METRICS_LISTEN": ""},
    )
    wait_until(lambda: started.check_alive() or answers(target), timeout=60, interval=0.1)
    worker_log = started.start("worker", ["examples/worker.py"], {"SHARDQ_TARGET": target})
    base = start_app(started, target)

    reply = httpx.post(f"{base}/signup", json={"email": "ada@example.com"}, timeout=10)
    assert reply.status_code == 200, reply.text
    job_id = reply.json()["job_id"]
    wait_for_line(started, worker_log, f"welcome email sent to ada@example.com (job {job_id})")
    wait_until(
        lambda: httpx.get(f"{base}/jobs/{job_id}", timeout=5).json()["status"] == "succeeded",
        timeout=10,
        interval=0.1,
    )
    # The transactional form needs PostgreSQL, and says so.
    refused = httpx.post(f"{base}/orders", json={"email": "ada@example.com", "item": "book"}, timeout=10)
    assert refused.status_code == 503 and "DATABASE_URL" in refused.json()["detail"]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_order_and_its_job_commit_together_or_not_at_all(
    started: Started,
    start_dispatcher: Callable[..., DispatcherProcess],
    redis_url: str,
    db_url: str,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    worker_log = started.start("worker", ["examples/worker.py"], {"SHARDQ_TARGET": dispatcher.target})
    base = start_app(started, dispatcher.target, database_url=db_url)

    kept = httpx.post(f"{base}/orders", json={"email": "kept@example.com", "item": "book"}, timeout=10)
    assert kept.status_code == 200, kept.text
    wait_for_line(started, worker_log, f"order {kept.json()['order_id']} confirmed for kept@example.com")

    failed = httpx.post(
        f"{base}/orders", json={"email": "gone@example.com", "item": "pen", "fail": True}, timeout=10
    )
    assert failed.status_code == 500 and "rolled back" in failed.json()["detail"]
    # An order committed after it, whose job shares its type's queue: once it has run, the rolled-back
    # one had every chance to.
    after = httpx.post(f"{base}/orders", json={"email": "after@example.com", "item": "cup"}, timeout=10)
    wait_for_line(started, worker_log, f"order {after.json()['order_id']} confirmed for after@example.com")
    assert "gone@example.com" not in worker_log.read_text()
    with psycopg.connect(db_url) as conn:
        orders = conn.execute("SELECT email, confirmation_job FROM example_orders ORDER BY id").fetchall()
        jobs = {row[0] for row in conn.execute("SELECT id FROM jobs")}
    assert [email for email, _ in orders] == ["kept@example.com", "after@example.com"]
    assert jobs == {job for _, job in orders}

"""Fixtures that start real dispatcher and worker processes (and stop them after the test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import DispatcherProcess, WorkerProcess

# Short timings so crash recovery is observable in seconds; the code paths are the production ones.
TEST_SETTINGS = {
    "processes": 1,
    "shard_count": 8,
    "reconnect_grace_ms": 1000,
    "reconcile_interval_s": 3600,
    "metrics_listen": "",  # many dispatchers per test: a test that scrapes sets its own port
}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


@pytest.fixture
def start_dispatcher(tmp_path: Path) -> Iterator[Callable[..., DispatcherProcess]]:
    started: list[DispatcherProcess] = []

    def start(redis_url: str, db_url: str, *, wait: bool = True, **settings: Any) -> DispatcherProcess:
        """``wait``: return once it answers (else at once)."""
        proc = DispatcherProcess(redis_url, db_url, tmp_path, **{**TEST_SETTINGS, **settings})
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def dispatcher(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> DispatcherProcess:
    return start_dispatcher(redis_url, db_url)


@pytest.fixture
def start_worker(tmp_path: Path, ledger: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(target: str, **options: Any) -> WorkerProcess:
        proc = WorkerProcess(target, options.pop("ledger", ledger), tmp_path, **options)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.kill()

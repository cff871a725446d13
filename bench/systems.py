"""The systems under test, each with its environment, its driver and the stack a scenario runs on.

A stack is what one scenario run needs, fresh: the system's private Redis flushed, and for shardq a
new database and a dispatcher started on it. Every system runs the scenarios it has the feature for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .driver_call import call_driver
from .infra.dispatcher import Dispatcher
from .infra.environments import node_modules, python_venv
from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis

ROOT = Path(__file__).resolve().parents[1]
#: the kinds of work the realistic-handler scenarios' jobs do (bench.peers._work); the plain
#: scenarios run no-op jobs
WORK_KINDS = ("redis", "io1ms", "cpu100us")
WORK_SCENARIOS = tuple(f"{family}-{work}" for family in ("drain", "instant") for work in WORK_KINDS)
ALL_SCENARIOS = ("ingest", "drain", "latency", "delay", "scale", "memory", *WORK_SCENARIOS)
#: a quick run's default: every no-op scenario and one small realistic drain
QUICK_SCENARIOS = ("ingest", "drain", "latency", "delay", "scale", "memory", "drain-redis")
PEERS = ("arq", "rq", "celery", "dramatiq", "saq", "bullmq")
#: Each Python peer's requirements (saq needs typing_extensions named by hand).
PEER_REQUIREMENTS = {
    "arq": ["arq"],
    "rq": ["rq"],
    "celery": ["celery[redis]"],
    "dramatiq": ["dramatiq[redis]"],
    "saq": ["saq[redis]", "typing_extensions"],
}
BULLMQ_PACKAGES = ["bullmq", "ioredis"]


@dataclass
class Stack:
    redis: PrivateRedis
    argv: list[str]
    env: dict[str, str]
    log: Path
    dispatcher: Dispatcher | None = None

    def call(self, action: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        return call_driver(self.argv, action, params, self.env, self.log, timeout)


@dataclass
class System:
    name: str
    scenarios: tuple[str, ...]
    argv: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def prepare(self) -> None:
        """Make the environment (may install); raises when it cannot."""

    def env(self, redis: PrivateRedis) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_REDIS_URL": redis.url, **self.extra_env}

    def describe(self, redis: PrivateRedis, log: Path) -> dict[str, Any]:
        return call_driver(self.argv, "versions", {}, self.env(redis), log, timeout=120)

    @contextmanager
    def stack(self, redis: PrivateRedis, log_dir: Path) -> Iterator[Stack]:
        redis.flush()
        yield Stack(redis, self.argv, self.env(redis), log_dir / f"{self.name}.log")


@dataclass
class PythonPeer(System):
    def prepare(self) -> None:
        python = python_venv(self.name, PEER_REQUIREMENTS[self.name])
        self.argv = [str(python), "-m", f"bench.peers.{self.name}"]


@dataclass
class BullmqPeer(System):
    def prepare(self) -> None:
        self.extra_env = {"NODE_PATH": str(node_modules(BULLMQ_PACKAGES))}
        self.argv = ["node", str(ROOT / "bench" / "peers" / "bullmq" / "driver.js")]


@dataclass
class Shardq(System):
    store: str = "postgres"
    postgres: Postgres | None = None
    processes: int = 2
    job_types: int = 8

    def prepare(self) -> None:
        self.argv = [sys.executable, "-m", "bench.peers.shardq"]
        self.extra_env = {"BENCH_JOB_TYPES": str(self.job_types)}

    def describe(self, redis: PrivateRedis, log: Path) -> dict[str, Any]:
        described = super().describe(redis, log)
        described["settings"].update(store=self.store, dispatcher=Dispatcher.describe(self.processes))
        if self.store == "postgres" and self.postgres is not None:
            described["settings"]["postgres"] = self.postgres.describe()
        return described

    @contextmanager
    def stack(self, redis: PrivateRedis, log_dir: Path) -> Iterator[Stack]:
        redis.flush()
        database = None
        if self.store == "postgres":
            assert self.postgres is not None
            database = self.postgres.new_database()
            db_url = database.url
        else:
            folder = log_dir / "sqlite"
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("shardq.sqlite3*"):
                old.unlink()
            db_url = f"sqlite:///{folder / 'shardq.sqlite3'}"
        dispatcher = Dispatcher(redis.url, db_url, log_dir / f"{self.name}-dispatcher", self.processes)
        try:
            dispatcher.start()
            env = {**self.env(redis), "SHARDQ_TARGET": dispatcher.target}
            yield Stack(redis, self.argv, env, log_dir / f"{self.name}.log", dispatcher)
        finally:
            dispatcher.stop()
            if database is not None:
                database.drop()


def make_systems(peers: list[str], postgres: Postgres | None, processes: int) -> list[System]:
    systems: list[System] = [
        Shardq("shardq", ALL_SCENARIOS, postgres=postgres, processes=processes),
        Shardq("shardq-sqlite", ("ingest",), store="sqlite", processes=processes),
    ]
    peer_scenarios = ("ingest", "drain", "latency", "delay", "memory", *WORK_SCENARIOS)  # scale: shardq only
    for peer in peers:
        peer_class = BullmqPeer if peer == "bullmq" else PythonPeer
        systems.append(peer_class(peer, peer_scenarios))
    return systems

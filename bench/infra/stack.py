"""shardq alone on a stack of its own, for the single-purpose measurements (``bench.worker_cost``,
``bench.enqueue_path``): a private redis-server, a fresh PostgreSQL database and ``dispatcher run``
with N processes, all stopped and dropped on the way out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .dispatcher import Dispatcher
from .postgres import Postgres
from .redis_server import PrivateRedis


@dataclass
class ShardqStack:
    redis_url: str
    db_url: str
    dispatcher: Dispatcher


@contextmanager
def shardq_stack(log_dir: Path, processes: int = 2) -> Iterator[ShardqStack]:
    redis_server = PrivateRedis().start()
    postgres = Postgres().start()
    database = postgres.new_database()
    dispatcher = Dispatcher(redis_server.url, database.url, log_dir, processes)
    try:
        dispatcher.start()
        yield ShardqStack(redis_server.url, database.url, dispatcher)
    finally:
        dispatcher.stop()
        database.drop()
        postgres.stop()
        redis_server.stop()

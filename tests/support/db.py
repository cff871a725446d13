"""Read the store's database straight, bypassing the dispatcher (what is really committed)."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg

from dispatcher.store import JobRow


def query(db_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) and return its rows."""
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute(sql, params).fetchall()
            conn.commit()
            return rows
    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(sql.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description else []


def statuses(db_url: str, ids: list[str]) -> dict[str, str]:
    marks = ", ".join("?" * len(ids))
    return dict(query(db_url, f"SELECT id, status FROM jobs WHERE id IN ({marks})", tuple(ids)))  # noqa: S608


def graph_row(job_id: str, waits: int = 0) -> JobRow:
    """A row for Store.insert_graph: type "t", shard 0, 'waiting' for ``waits`` dependencies, or
    'ready' without any."""
    return JobRow(
        id=job_id, type="t", shard=0, priority=1, payload=b"{}", status="waiting" if waits else "ready",
        run_at=1, lease_until=None, attempts=0, failures=0, expirations=0, max_attempts=5,
        lease_ttl_ms=60_000, idem_key=None, last_error=None, dead_reason=None, result=None,
        enqueued_at=1, started_at=None, finished_at=None, updated_at=1, deps_remaining=waits,
    )  # fmt: skip

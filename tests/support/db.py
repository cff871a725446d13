"""Read the store's database straight, bypassing the dispatcher (what is really committed)."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg


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

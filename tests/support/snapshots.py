"""Read the state a dispatcher keeps, straight from Redis and the database (not through the dispatcher),
so a test can assert that a request changed nothing, or exactly what it changed."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Any

import psycopg
import redis


def _db_rows(db_url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            return [tuple(r) for r in conn.execute(query, params).fetchall()]
    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        return [tuple(r) for r in conn.execute(query.replace("?", "%s"), params).fetchall()]


def count_jobs(db_url: str, job_type: str | None = None) -> int:
    """Rows in the jobs table (of one type)."""
    if job_type is None:
        return int(_db_rows(db_url, "SELECT COUNT(*) FROM jobs")[0][0])
    return int(_db_rows(db_url, "SELECT COUNT(*) FROM jobs WHERE type = ?", (job_type,))[0][0])


def db_status(db_url: str, job_id: str) -> str | None:
    """The job's status column, or None when there is no such row."""
    rows = _db_rows(db_url, "SELECT status FROM jobs WHERE id = ?", (job_id,))
    return str(rows[0][0]) if rows else None


def db_digest(db_url: str) -> tuple[int, str]:
    """(rows, a digest of every row's id, status, counters and update time) of the jobs table, and
    of every schedule row."""
    rows = _db_rows(
        db_url,
        "SELECT id, status, attempts, failures, expirations, run_at, updated_at FROM jobs ORDER BY id",
    )
    schedules = _db_rows(db_url, "SELECT * FROM schedules ORDER BY name")
    return len(rows), hashlib.sha256(repr((rows, schedules)).encode()).hexdigest()


def job_keys_in_redis(redis_url: str) -> dict[str, int]:
    """Per shard jobs/payloads hash, its number of entries (only the non-empty ones)."""
    with redis.Redis.from_url(redis_url) as r:
        out = {}
        for pattern in ("shardq:*:jobs", "shardq:*:payloads"):
            for key in r.scan_iter(match=pattern):
                n = int(r.hlen(key))
                if n:
                    out[key.decode()] = n
        return out


@dataclass(frozen=True)
class RedisDigest:
    """Every shard key's content (the ownership lease's renewal time left out: it moves every tick)."""

    dbsize: int
    keys: dict[str, str]  # key -> sha256 of its type and content

    def changed(self, other: RedisDigest) -> list[str]:
        names = set(self.keys) | set(other.keys)
        return sorted(k for k in names if self.keys.get(k) != other.keys.get(k))


def redis_digest(redis_url: str) -> RedisDigest:
    with redis.Redis.from_url(redis_url) as r:
        keys = {}
        for raw in r.scan_iter(match="shardq:{s*}:*", count=1000):
            key = raw.decode()
            kind = r.type(raw).decode()
            if key.endswith(":meta"):
                content: Any = r.hmget(raw, "epoch", "owner")
            elif kind == "hash":
                content = sorted(r.hgetall(raw).items())
            elif kind == "zset":
                content = r.zrange(raw, 0, -1, withscores=True)
            elif kind == "set":
                content = sorted(r.smembers(raw))
            else:
                content = r.get(raw)
            keys[key] = hashlib.sha256(repr((kind, content)).encode()).hexdigest()
        return RedisDigest(int(r.dbsize()), keys)

"""The database's size per job, measured on PostgreSQL and SQLite, and what 10M jobs a day take.

    python -m bench.db_size [--rows 1000000] [--backends postgres,sqlite]

For each backend: a fresh database with shardq's migrations applied (the dispatcher's own
``migrate``), the size of every table and index of the schema, then ``--rows`` finished jobs as the
status writer leaves them (26-character ids, 20 job types, a 55-byte JSON payload, a 2-byte result,
a ``traceparent`` header on half, an idempotency key on a fifth, 1% dead with an error), after which
PostgreSQL is VACUUM ANALYZEd (the visibility map set, as after a while in production) and SQLite
checkpointed, and the sizes again. The difference over the rows is the bytes a finished job takes;
times 10M is a day at the mission's load, times the default retention (7 days of succeeded and
cancelled jobs, 30 of the 1% that die) the steady-state size. Rows are bulk-loaded (COPY, one
executemany): a table written row by row over days also holds the free space its updates and
deletes leave, which the documentation adds as headroom.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from dispatcher.store.open import open_store

from .infra.postgres import Postgres

DAY = 10_000_000
TYPES = [f"app.jobs.type{i:02d}" for i in range(20)]
PAYLOAD = b'{"user": 123456, "template": "welcome", "locale": "en"}'
HEADERS = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
COLUMNS = (
    "id", "type", "shard", "priority", "payload", "status", "run_at", "attempts", "max_attempts",
    "lease_ttl_ms", "idem_key", "last_error", "dead_reason", "result", "enqueued_at", "started_at",
    "finished_at", "updated_at", "headers",
)  # fmt: skip


def rows(n: int, start_ms: int) -> Iterator[tuple]:
    for i in range(n):
        at = start_ms + i * 8  # 10M a day is one every 8.6 ms
        dead = i % 100 == 0
        yield (
            f"{at:013x}{i:013x}", TYPES[i % len(TYPES)], i % 64, 1, PAYLOAD,
            "dead" if dead else ("cancelled" if i % 500 == 1 else "succeeded"), at, 5 if dead else 1, 5,
            60_000, f"order-{i:012d}-confirmation" if i % 5 == 0 else None,
            "ValueError: the upstream answered 503" if dead else None, "failed" if dead else None,
            None if dead else b"ok", at, at + 3, at + 15, at + 15, HEADERS if i % 2 else None,
        )  # fmt: skip


def _migrate(url: str) -> None:
    async def go() -> None:
        store = await open_store(url)
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(go())


def postgres(n: int) -> dict[str, float]:
    server = Postgres().start()
    database = server.new_database()
    try:
        _migrate(database.url)
        with psycopg.connect(database.url, autocommit=True) as conn:
            size_sql = (
                "SELECT sum(pg_relation_size(c.oid)), sum(pg_indexes_size(c.oid)), "
                "sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace s "
                "ON s.oid = c.relnamespace WHERE s.nspname = current_schema() AND c.relkind = 'r'"
            )
            before = conn.execute(size_sql).fetchone()
            t0 = time.perf_counter()
            with conn.cursor().copy(f"COPY jobs ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in rows(n, int(time.time() * 1000) - 86_400_000):
                    copy.write_row(row)
            conn.execute("VACUUM ANALYZE")
            loaded = time.perf_counter() - t0
            after = conn.execute(size_sql).fetchone()
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    finally:
        database.drop()
        server.stop()
    table, indexes, total = (float(a - b) / n for a, b in zip(after, before, strict=True))  # type: ignore[arg-type]
    return {"version": version, "table": table, "indexes": indexes, "total": total, "load_s": loaded}


def sqlite(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "size.sqlite3"
        _migrate(f"sqlite:///{path}")
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = os.path.getsize(path)
        t0 = time.perf_counter()
        marks = ", ".join("?" * len(COLUMNS))
        with conn:
            conn.executemany(f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({marks})", rows(n, 0))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        loaded = time.perf_counter() - t0
        after = os.path.getsize(path)
        # Table and indexes apart, from the dbstat virtual table when this SQLite has it.
        table = indexes = float("nan")
        try:
            by_name = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
            kinds = dict(conn.execute("SELECT name, type FROM sqlite_master"))
            table = by_name.get("jobs", 0) / n
            indexes = (
                sum(
                    v
                    for k, v in by_name.items()
                    if kinds.get(k) == "index" or k.startswith("sqlite_autoindex_jobs")
                )
                / n
            )
        except sqlite3.OperationalError:
            pass
        version = sqlite3.sqlite_version
        conn.close()
    return {
        "version": version,
        "table": table,
        "indexes": indexes,
        "total": (after - before) / n,
        "load_s": loaded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backends", default="postgres,sqlite")
    args = parser.parse_args()
    print(f"{args.rows:,} finished jobs per backend")
    print("| backend | table B/job | indexes B/job | total B/job | GB a day at 10M | GB, default retention |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for backend in args.backends.split(","):
        got = {"postgres": postgres, "sqlite": sqlite}[backend](args.rows)
        day = got["total"] * DAY / 1e9
        print(
            f"| {backend} {got['version']} | {got['table']:,.0f} | {got['indexes']:,.0f} "
            f"| {got['total']:,.0f} | {day:,.2f} | {day * 7 + day * 0.01 * 23:,.1f} |"
            f"  (loaded in {got['load_s']:.0f} s)"
        )


if __name__ == "__main__":
    main()

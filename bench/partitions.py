"""Time partitions of the jobs table on PostgreSQL: retiring a day partition against deleting the
same rows in batches, and what partitioning costs an insert.

    python -m bench.partitions [--rows 1000000] [--survivors 0.01] [--seconds 5]

Two fresh databases on a throwaway PostgreSQL cluster of its own (``--shared``: the server the
tests use): one migrated to the partitioned table (migration 0014),
one as it was before (0001..0011: a plain table with the same indexes). Both get the same rows: a
day ``--rows`` jobs finished 10 days ago (``--survivors`` of them dead 9 days ago, which retention
keeps 30 days), and a current day of the same size. Then:

1. the day retired as the table keeper does it (store/partitions.py: its survivors copied into a
   kept partition, the rest dropped) against the pruner's batched deletes of the same finished rows
   on the plain table (1,000 ids a statement, as ``finished_before`` reads them and
   ``delete_finished`` deletes them; no pause between batches): time, WAL bytes, the tables' size
   (table, TOAST and indexes) after, and after a VACUUM of the plain table;
2. the same two again on fresh databases, each beside an inserter (single-row INSERTs of new
   jobs, durable, as a lone enqueue commits them, one after another), whose p99 is compared with
   its own for ``--seconds`` just before, on the same database;
3. inserts and updates: ``--seconds`` of single-row INSERTs, of 200-row INSERTs (the enqueue's
   batch statement) and of 500-row status UPDATEs by id (the status writer's) on each table, in
   turn: the partitioned table's rate over the plain one's.

Every figure is a ratio of two measurements made in the same run (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from dispatcher.config import RetentionPolicy
from dispatcher.queue.ids import new_job_ids
from dispatcher.store import open_store
from dispatcher.store.partitions import Cutoffs, PartitionQueries, id_prefix
from dispatcher.store.postgres import _INSERT_NEW_JOBS, _UPDATE_MANY, _as_columns

from .infra.postgres import Postgres

DAY_MS = 86_400_000
PAYLOAD = b'{"user": 123456, "template": "welcome", "locale": "en"}'


def _fill(conn: psycopg.Connection[Any], day_ms: int, rows: int, finished_ms: int, survivors: float) -> None:
    """``rows`` jobs made during the day of ``day_ms``, ids in time order, finished at
    ``finished_ms``; every 1/survivors-th one dead a day later (kept by retention's 30 days)."""
    every = max(1, round(1 / survivors)) if survivors else 0
    dead = f"mod(i, {every}) = 0" if every else "false"
    conn.execute(
        f"""INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, attempts, max_attempts,
            lease_ttl_ms, result, enqueued_at, started_at, finished_at, updated_at, dead_reason)
        SELECT shardq_job_id_time(%s + i * (86400000 / %s)) || lpad(i::text, 16, '0'),
            'bench.type' || mod(i, 20), mod(i, 64), 1, %s,
            CASE WHEN {dead} THEN 'dead' ELSE 'succeeded' END, %s, 1, 5, 60000,
            CASE WHEN NOT ({dead}) THEN '\\x6f6b'::bytea END, %s, %s,
            CASE WHEN {dead} THEN %s::bigint + 86400000 ELSE %s END, %s,
            CASE WHEN {dead} THEN 'failed' END
        FROM generate_series(1, %s) AS i""",
        (day_ms, rows, PAYLOAD, day_ms, day_ms, day_ms, finished_ms, finished_ms, finished_ms, rows),
    )


def _wal(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    return int(row[0]) if row else 0


def _size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('jobs')), 0)"
        " + pg_total_relation_size('jobs')"
    ).fetchone()
    return int(row[0]) if row else 0


class Inserter:
    """Single-row INSERTs of new jobs, one after another, on a connection of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                job_id = new_job_ids(1)[0]
                t0 = time.perf_counter()
                conn.execute(
                    "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                    "lease_ttl_ms, enqueued_at, updated_at) "
                    "VALUES (%s, 'bench.new', 1, 1, %s, 'ready', 1, 5, 60000, 1, 1)",
                    (job_id, PAYLOAD),
                )
                self.latencies.append(time.perf_counter() - t0)

    def __enter__(self) -> Inserter:
        self._thread.start()
        time.sleep(0.5)  # its connection made and warm before the measured work starts
        self.latencies.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def p99_ms(self) -> float:
        ms = sorted(x * 1000 for x in self.latencies)
        return ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else float("nan")


def _delete_in_batches(url: str, cutoffs: Cutoffs) -> int:
    """The pruner's statements on the plain table: ids read from jobs_finished, deleted by id."""
    total = 0
    with psycopg.connect(url, autocommit=True) as conn:
        types = [f"bench.type{i}" for i in range(20)]
        for job_type in types:
            for status in ("succeeded", "cancelled", "dead"):
                after: tuple[int, str] | None = None
                while True:
                    keyset = "AND (finished_at, id) > (%s, %s) " if after else ""
                    rows = conn.execute(
                        "SELECT id, finished_at FROM jobs WHERE status IN ('succeeded', 'cancelled', 'dead') "
                        f"AND type = %s AND status = %s AND finished_at < %s {keyset}"
                        "ORDER BY finished_at, id LIMIT 1000",
                        (job_type, status, cutoffs.of(job_type, status), *(after or ())),
                    ).fetchall()
                    if not rows:
                        break
                    after = (rows[-1][1], rows[-1][0])
                    deleted = conn.execute(
                        "DELETE FROM jobs WHERE id = ANY(%s) AND status = %s AND finished_at < %s",
                        ([r[0] for r in rows], status, cutoffs.of(job_type, status)),
                    )
                    total += deleted.rowcount
    return total


def _retire(url: str, cutoffs: Cutoffs, day_ms: int) -> str:
    async def go() -> str:
        store = await open_store(url)
        try:
            assert isinstance(store, PartitionQueries)
            old = next(p for p in await store.partitions() if p.lo_ms == day_ms)
            result = await store.retire_partition(old, cutoffs, [], max_share=0.5)
            await store.sweep_orphans(old.lo, old.hi)
            return f"{result.outcome}: {result.rows:,} rows, {result.survivors:,} kept"
        finally:
            await store.close()

    return asyncio.run(go())


def _timed(work: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = work()
    return time.perf_counter() - t0, out


async def _prepare(url: str, partitioned: bool, now: int) -> None:
    store = await open_store(url)
    try:
        await store.migrate(before=None if partitioned else "0012")
        if partitioned:
            assert isinstance(store, PartitionQueries)
            await store.ensure_partitions(now - 11 * DAY_MS, now + 3 * DAY_MS, DAY_MS)
    finally:
        await store.close()


def _setup(url: str, partitioned: bool, rows: int, survivors: float, now: int) -> None:
    asyncio.run(_prepare(url, partitioned, now))
    today = now - now % DAY_MS
    old_day = today - 10 * DAY_MS
    with psycopg.connect(url, autocommit=True) as conn:
        _fill(conn, old_day, rows, old_day + 3_600_000, survivors)
        _fill(conn, today, rows, now - 60_000, 0)
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("CHECKPOINT")


def _insert_rate(url: str, seconds: float, batch: int) -> float:
    """Rows per second of INSERTs of ``batch`` new jobs (the enqueue's unnest statement)."""
    n = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # the table's cost, not the disk's flush
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rows = [
                (i, "bench.new", 1, 1, PAYLOAD, "ready", 1, 5, 60000, None, 1, 1, None, None)
                for i in new_job_ids(batch)
            ]
            conn.execute(_INSERT_NEW_JOBS, _as_columns(rows))
            n += batch
    return n / seconds


def _update_rate(url: str, seconds: float, batch: int) -> float:
    """Rows per second of the status writer's statement (one UPDATE of ``batch`` jobs by id, a
    lease's columns), over the current day's rows."""
    n = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        today = id_prefix(int(time.time() * 1000) // DAY_MS * DAY_MS)
        ids = [
            r[0]
            for r in conn.execute("SELECT id FROM jobs WHERE type = 'bench.type1' AND id >= %s", (today,))
        ]
        conn.execute("UPDATE jobs SET status = 'ready' WHERE id = ANY(%s)", (ids,))
        deadline, i = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            chunk = ids[i : i + batch] or ids[:batch]
            i = i + batch if i + batch < len(ids) else 0
            now = int(time.time() * 1000)
            k = len(chunk)
            none = [None] * k
            columns = [
                chunk,
                ["leased"] * k,
                none,
                [now] * k,
                [1] * k,
                none,
                none,
                none,
                none,
                none,
                [now] * k,
            ]
            conn.execute(_UPDATE_MANY, [now, *columns, none, none])
            n += k
    return n / seconds


def _rates(urls: dict[bool, str], seconds: float, rounds: int = 3) -> dict[bool, dict[str, float]]:
    """The insert and update rates of both tables, measured in turn (the order swapped each round,
    so the machine's drift falls on both): the median of the rounds."""
    samples: dict[bool, dict[str, list[float]]] = {p: {} for p in urls}
    for i in range(rounds):
        for partitioned in (True, False) if i % 2 == 0 else (False, True):
            url, mine = urls[partitioned], samples[partitioned]
            mine.setdefault("insert1", []).append(_insert_rate(url, seconds, 1))
            mine.setdefault("insert200", []).append(_insert_rate(url, seconds, 200))
            mine.setdefault("update500", []).append(_update_rate(url, seconds, 500))
    return {p: {k: statistics.median(v) for k, v in m.items()} for p, m in samples.items()}


def _work(
    url: str, partitioned: bool, loaded: bool, seconds: float, cutoffs: Cutoffs, old_day: int
) -> dict[str, Any]:
    run: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        inserter = Inserter(url) if loaded else None
        if inserter:
            with Inserter(url) as alone:
                time.sleep(seconds)
            run["p99_alone"] = alone.p99_ms()
            inserter.__enter__()
        size0, wal0 = _size(conn), _wal(conn)
        try:
            if partitioned:
                took, what = _timed(lambda: _retire(url, cutoffs, old_day))
            else:
                took, deleted = _timed(lambda: _delete_in_batches(url, cutoffs))
                what = f"{deleted:,} rows deleted"
        finally:
            if inserter:
                inserter.__exit__()
        run.update(s=took, wal=_wal(conn) - wal0, before=size0, after=_size(conn), what=what)
        if inserter:
            run["p99"] = inserter.p99_ms()
        if not partitioned and not loaded:
            run["vacuum_s"], _ = _timed(lambda: conn.execute("VACUUM jobs"))
            run["after_vacuum"] = _size(conn)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="jobs of one day")
    parser.add_argument("--survivors", type=float, default=0.01, help="share of the old day kept (dead)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--shared",
        action="store_true",
        help="the server of SHARDQ_TEST_PG_URL (or 127.0.0.1:5432) instead of a cluster of its own; "
        "its WAL then counts every database's writes",
    )
    args = parser.parse_args()
    postgres = Postgres().start() if args.shared else Postgres().start_private()
    print(f"PostgreSQL: {postgres.source}; {os.cpu_count()} CPUs")
    try:
        now = int(time.time() * 1000)
        policy = RetentionPolicy()
        cutoffs = Cutoffs(now - policy.succeeded_s * 1000, now - policy.dead_s * 1000)
        old_day = now - now % DAY_MS - 10 * DAY_MS
        runs: dict[str, dict[str, Any]] = {}
        for loaded in (False, True):
            dbs = {partitioned: postgres.new_database() for partitioned in (True, False)}
            try:
                for partitioned, db in dbs.items():
                    _setup(db.url, partitioned, args.rows, args.survivors, now)
                if not loaded:  # the tables' costs, with both days in them, before the work
                    runs["rates"] = _rates({p: db.url for p, db in dbs.items()}, args.seconds)
                for partitioned, db in dbs.items():
                    name = ("partition retired" if partitioned else "batched deletes") + (
                        " + inserter" if loaded else ""
                    )
                    runs[name] = _work(db.url, partitioned, loaded, args.seconds, cutoffs, old_day)
            finally:
                for db in dbs.values():
                    db.drop()
        _report(runs, args)
    finally:
        postgres.stop()


def _report(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    mb = 1 << 20
    part, plain = runs["partition retired"], runs["batched deletes"]
    print(
        f"\n== retiring a day of {args.rows:,} jobs ({args.survivors:.0%} kept) vs deleting its finished rows"
    )
    for name in ("partition retired", "batched deletes"):
        r = runs[name]
        extra = (
            f"; VACUUM {r['vacuum_s']:.1f} s, after it {r['after_vacuum'] / mb:,.0f} MiB"
            if "vacuum_s" in r
            else ""
        )
        print(
            f"   {name:<20} {r['s']:7.2f} s  WAL {r['wal'] / mb:8,.1f} MiB  size {r['before'] / mb:,.0f} -> "
            f"{r['after'] / mb:,.0f} MiB{extra}  ({r['what']})"
        )
    print(
        f"   deletes / retirement: time {plain['s'] / part['s']:.1f}x, "
        f"WAL {plain['wal'] / max(part['wal'], 1):.1f}x; "
        f"size after: plain {plain['after'] / part['after']:.2f}x the partitioned table's "
        f"({plain['after_vacuum'] / part['after']:.2f}x after its VACUUM)"
    )
    print("\n== single-row insert p99 (durable commits), alone and then beside the work, same database")
    for name in ("partition retired + inserter", "batched deletes + inserter"):
        r = runs[name]
        print(
            f"   {name:<30} alone {r['p99_alone']:6.2f} ms, beside {r['p99']:6.2f} ms = "
            f"{r['p99'] / r['p99_alone']:.2f}x (the work took {r['s']:.1f} s)"
        )
    print(
        "\n== inserts and status updates before the work, partitioned / plain table "
        "(rows per second, synchronous_commit off; median of 3 rounds taken in turn)"
    )
    part, plain = runs["rates"][True], runs["rates"][False]
    for key, label in (
        ("insert1", "single-row INSERT"),
        ("insert200", "200-row INSERT"),
        ("update500", "500-row status UPDATE"),
    ):
        print(
            f"   {label:<20} {part[key]:10,.0f} / {plain[key]:10,.0f} rows/s = {part[key] / plain[key]:.2f}x"
        )


if __name__ == "__main__":
    main()

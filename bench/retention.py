"""Retention on PostgreSQL: the query plans of the pruner's statements, the size of a finished row,
and enqueue latency while 200,000 old rows are pruned.

    python -m bench.retention [--rows 200000] [--explain-rows 1000000] [--seconds 10]

Starts a private redis-server, a fresh PostgreSQL database and ``dispatcher run`` (1 process), then:

1. ``--explain-rows`` finished rows (and 5% active ones) over 20 job types, ANALYZE, and EXPLAIN
   (ANALYZE, BUFFERS) of each statement the pruner runs (dispatcher/store/retention.py);
2. the bytes one finished row takes (table, TOAST and every index), from the size of the table
   before and after, and the same per day at 10M jobs/day and per retention window;
3. enqueue latency (one ``Client.enqueue`` after another, 4 producer threads) for ``--seconds``
   with nothing else running, then while ``dispatcherctl jobs prune``'s RPC deletes ``--rows``
   finished rows (batches of 1,000, 50 ms apart: the pruner's defaults), and the prune's rate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from dispatcher.store.retention import _TYPES, FINISHED_SQL, MAX_TYPES
from worker_sdk import Client

from .infra.stack import shardq_stack

DAY_MS = 86_400_000
TYPES = [f"bench.retention{i}" for i in range(20)]
PAYLOAD = b'{"user": 123456, "template": "welcome", "locale": "en"}'  # 55 bytes: a typical small job


def _fill(
    conn: psycopg.Connection, rows: int, prefix: str, finished_days_ago: float, active_share: float
) -> None:
    """``rows`` finished jobs (succeeded, some cancelled and dead) plus ``active_share`` of active
    ones, spread over TYPES, as the status writer leaves them."""
    now = int(time.time() * 1000)
    finished = int(now - finished_days_ago * DAY_MS)
    types = "ARRAY[" + ", ".join(f"'{t}'" for t in TYPES) + "]"
    conn.execute(
        f"""INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, attempts, max_attempts,
            lease_ttl_ms, result, enqueued_at, started_at, finished_at, updated_at, dead_reason)
        SELECT '{prefix}' || lpad(i::text, 25, '0'), ({types})[1 + i %% {len(TYPES)}], i %% 64, 1, %s,
            CASE WHEN i %% 100 = 0 THEN 'dead' WHEN i %% 50 = 1 THEN 'cancelled' ELSE 'succeeded' END,
            {finished} - 1000, 1, 5, 60000, CASE WHEN i %% 100 > 1 THEN '\\x6f6b'::bytea END,
            {finished} - 1000 - i %% 1000, {finished} - 500,
            {finished} + i %% 86400000, {finished} + i %% 86400000,
            CASE WHEN i %% 100 = 0 THEN 'failed' END
        FROM generate_series(1, %s) AS i""",
        (PAYLOAD, rows),
    )
    active = int(rows * active_share)
    if active:
        conn.execute(
            f"""INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts,
                lease_ttl_ms, enqueued_at, updated_at)
            SELECT '{prefix}a' || lpad(i::text, 24, '0'), ({types})[1 + i %% {len(TYPES)}], i %% 64, 1, %s,
                'delayed', {now + DAY_MS}, 5, 60000, {now}, {now}
            FROM generate_series(1, %s) AS i""",
            (PAYLOAD, active),
        )


def _size(conn: psycopg.Connection) -> dict[str, int]:
    # Over every partition on a partitioned table (migration 0014), or the table itself.
    row = conn.execute(
        "SELECT sum(pg_relation_size(t.relid)), "
        "sum(pg_total_relation_size(t.relid) - pg_relation_size(t.relid) - pg_indexes_size(t.relid)), "
        "sum(pg_indexes_size(t.relid)), sum(pg_total_relation_size(t.relid)) "
        "FROM (SELECT relid FROM pg_partition_tree('jobs') UNION SELECT 'jobs'::regclass) AS t"
    ).fetchone()
    assert row is not None
    return dict(zip(("table", "toast", "indexes", "total"), (int(v) for v in row), strict=True))


def explain(db_url: str, rows: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        t0 = time.perf_counter()
        _fill(conn, rows, "x", 10, 0.05)
        conn.execute("ANALYZE jobs")
        print(
            f"\n== query plans: {rows:,} finished rows + {int(rows * 0.05):,} active over {len(TYPES)} types "
            f"(filled in {time.perf_counter() - t0:.0f} s)"
        )
        cutoff = int(time.time() * 1000) - 7 * DAY_MS
        t = TYPES[3]
        statements = {
            "types with finished rows (loose index scan)": (_TYPES.replace("?", "%s"), (MAX_TYPES,)),
            "a batch of candidates after the last one seen (finished_before)": (
                f"SELECT id, finished_at FROM jobs WHERE {FINISHED_SQL} AND type = %s AND status = %s "
                "AND finished_at < %s AND (finished_at, id) > (%s, %s) ORDER BY finished_at, id LIMIT 1000",
                (t, "succeeded", cutoff, int(time.time() * 1000) - 10 * DAY_MS + 500_000, ""),
            ),
            "the oldest finished row of a type (oldest_finished)": (
                f"SELECT MIN(finished_at) FROM jobs WHERE {FINISHED_SQL} AND type = %s AND status = %s "
                "AND finished_at IS NOT NULL",
                (t, "succeeded"),
            ),
        }
        for name, (sql, params) in statements.items():
            print(f"\n-- {name}")
            for (line,) in conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params):
                print("   " + line)
        ids = [
            r[0]
            for r in conn.execute(
                statements["a batch of candidates after the last one seen (finished_before)"][0],
                statements["a batch of candidates after the last one seen (finished_before)"][1],
            )
        ]
        print("\n-- a batch's delete (delete_finished), 1,000 ids; rolled back")
        with conn.transaction(force_rollback=True):
            marks = ", ".join(["%s"] * len(ids))
            for (line,) in conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) DELETE FROM jobs WHERE id IN ({marks}) "
                "AND status = %s AND finished_at < %s",
                (*ids, "succeeded", cutoff),
            ):
                print("   " + (line if len(line) < 160 else line[:150] + " ...})"))
        conn.execute("DELETE FROM jobs WHERE id LIKE 'x%'")
        conn.execute("VACUUM jobs")


def row_size(db_url: str, rows: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("VACUUM FULL jobs")
        before = _size(conn)
        _fill(conn, rows, "s", 3, 0)
        conn.execute("VACUUM ANALYZE jobs")  # the visibility map set, as after a while in production
        after = _size(conn)
    per_row = {k: (after[k] - before[k]) / rows for k in after}
    print(f"\n== a finished row on PostgreSQL ({rows:,} rows, {len(PAYLOAD)}-byte payload, 2-byte result)")
    print("   bytes per row: " + ", ".join(f"{k} {v:,.0f}" for k, v in per_row.items()))
    day = per_row["total"] * 10_000_000
    print(
        f"   at 10M jobs/day: {day / 1e9:,.2f} GB/day; kept 7 days (succeeded, cancelled) and 30 days "
        f"(dead, 1% of jobs): {(day * 7 + day * 0.01 * 23) / 1e9:,.1f} GB"
    )


def _enqueue_latencies(target: str, seconds: float, stop: threading.Event | None = None) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def producer(n: int) -> None:
        with Client(target, route=True) as client:
            for _ in range(20):
                client.enqueue(TYPES[n], {"warm": True}, delay=86_400)
            mine = []
            while time.monotonic() < deadline and not (stop and stop.is_set()):
                t0 = time.perf_counter()
                client.enqueue(TYPES[n], {"n": n}, delay=86_400)  # delayed: no worker needed
                mine.append(time.perf_counter() - t0)
            with lock:
                out.extend(mine)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _summary(name: str, samples: list[float]) -> tuple[float, float]:
    ms = sorted(x * 1000 for x in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    p50 = statistics.median(ms)
    print(f"   {name:<34} {len(ms):>7,} enqueues  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    return p50, p99


def prune_under_load(db_url: str, target: str, rows: int, seconds: float) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM jobs WHERE id LIKE 's%'")
        _fill(conn, rows, "p", 3, 0)
        conn.execute("VACUUM ANALYZE jobs")
    print(
        "\n== enqueue latency, 4 producers one enqueue after another, "
        f"with and without a prune of {rows:,} rows"
    )
    _, base_p99 = _summary("no prune", _enqueue_latencies(target, seconds))
    done = threading.Event()
    result: dict[str, float] = {}

    def prune() -> None:
        t0 = time.perf_counter()
        total, more = 0, True
        with Client(target, timeout=300) as client:
            while more:
                n, more = client.prune_jobs(86_400, limit=20_000)
                total += n
        result["rows"], result["s"] = total, time.perf_counter() - t0
        done.set()

    pruner = threading.Thread(target=prune)
    pruner.start()
    _, prune_p99 = _summary("during the prune", _enqueue_latencies(target, 3600, stop=done))
    pruner.join()
    print(
        f"   prune: {result['rows']:,.0f} rows in {result['s']:.1f} s "
        f"({result['rows'] / result['s']:,.0f} rows/s; "
        f"10M jobs/day is {10_000_000 / 86_400:,.0f}/s)"
    )
    print(f"   p99 during / without: {prune_p99 / base_p99:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--explain-rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs, shardq_stack(Path(logs), 1) as stack:
        if args.explain_rows:
            explain(stack.db_url, args.explain_rows)
        row_size(stack.db_url, args.rows)
        prune_under_load(stack.db_url, stack.dispatcher.target, args.rows, args.seconds)


if __name__ == "__main__":
    main()

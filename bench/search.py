"""The job search on PostgreSQL at scale: the first page of every filter the dashboard offers, and
what the search's indexes cost the enqueue path.

    python -m bench.search [--rows 10000000] [--db-url URL [--skip-fill]] [--keep] [--steps ...]

1. Fills a fresh database's ``jobs`` table (the dispatcher's migrations) with ``--rows`` rows by
   COPY, a realistic mix: 40 job types of very different sizes (billing.charge has a quarter of the
   rows, billing.rare one in 100,000), states as a busy week leaves them (88% succeeded, 3% dead, 1%
   cancelled, delayed, ready and leased ones), three priority classes, created over 7 days (the ids
   are made from the creation time, as queue/ids.py makes them), idempotency keys on 5%, 2% from
   three schedules, errors on the dead and on 5% of the others, JSON payloads with a customer_id (a
   skewed draw from 100,000 customers) and 2% payloads that are not JSON. The secondary indexes
   are dropped before the COPY and built after it, each timed (the cost of adding it to a live
   table of that size).
2. Times the first page (50 jobs, the store's ListJobs query, ``dispatcher/store/search.py``) of
   each filter alone and of a few combinations, newest first and oldest first: the first run and
   the median of 5, in ms, and the plan's top node (a search stopped at the store's statement
   timeout is reported as such). Then the payload filters once more with the expression index
   docs/operations.md advises for a field that searches use, and the error-text filters with a
   trigram index (pg_trgm, when installed), each index's build time and size.
3. Write amplification on the enqueue path: inserting 100,000 new jobs (COPY) and moving them
   through three status updates (the status writer's kind of statement, 1,000 rows each), with,
   without, then again with the indexes of migration 0013, then the same for those of 0019, as a
   ratio of one run.

``--db-url`` reuses a database filled before (``--skip-fill``); ``--keep`` leaves the one made;
``--steps`` picks among filters, payload, error, writes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from dispatcher.queue import job_filter
from dispatcher.queue.ids import ids_from
from dispatcher.store.postgres import PostgresStore
from dispatcher.store.search import SEARCH_TIMEOUT_MS, SearchTooSlow
from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb

from .infra.postgres import Postgres

SHARDS = 64
DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
PAGE = 50
#: (type, share of rows): a few big types, a long tail, one rare type.
TYPES: list[tuple[str, float]] = [
    ("billing.charge", 0.25),
    ("email.send", 0.20),
    ("billing.refund", 0.05),
    ("billing.invoice", 0.05),
    ("report.build", 0.04),
    ("image.resize", 0.10),
    ("webhook.deliver", 0.08),
    *((f"tenant.sync{i}", 0.0065) for i in range(32)),
    ("billing.rare", 0.00001),
]
STATES = [
    ("succeeded", 0.88),
    ("dead", 0.03),
    ("cancelled", 0.01),
    ("delayed", 0.05),
    ("ready", 0.02),
    ("leased", 0.01),
]
ERRORS = [
    "Traceback (most recent call last):\n  ...\nTimeoutError: upstream did not answer in 30 s",
    "Traceback (most recent call last):\n  ...\nConnectionResetError: [Errno 104] Connection reset by peer",
    "Traceback (most recent call last):\n  ...\nValueError: card declined by issuer",
    "Traceback (most recent call last):\n  ...\nKeyError: 'template'",
]
REASONS = ["handler_error", "not_retryable", "lease_expired"]
SCHEDULES = ["nightly-report", "hourly-sync", "minutely-ping"]
COLUMNS = (
    "id, type, shard, priority, payload, status, run_at, lease_until, attempts, failures, max_attempts, "
    "lease_ttl_ms, idem_key, last_error, dead_reason, enqueued_at, started_at, finished_at, updated_at, "
    "schedule"
)


def _draw(pairs: list[tuple[str, float]], n: int, rng: random.Random) -> list[str]:
    names, weights = zip(*pairs, strict=True)
    return rng.choices(names, weights, k=n)


def _customer(rng: random.Random) -> int:
    return min(int(rng.paretovariate(1.1)), 100_000)  # a few customers have most jobs


def _rows(n: int, now: int, seed: int, key_prefix: str = "key") -> Iterator[tuple[Any, ...]]:
    rng = random.Random(seed)
    chunk = 50_000
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        types = _draw(TYPES, size, rng)
        states = _draw(STATES, size, rng)
        for i in range(size):
            k = start + i
            created = now - WEEK_MS + (k * WEEK_MS) // n  # in id order, as ids are made
            job_id = ids_from(created, rng.randbytes(16))[0]
            job_type, status = types[i], states[i]
            if rng.random() < 0.02:
                payload = rng.randbytes(24)  # not JSON: never matches a payload field
            else:
                payload = f'{{"customer_id": {_customer(rng)}, "amount": {rng.randint(1, 99999)}}}'.encode()
            finished = status in ("succeeded", "dead", "cancelled")
            error = reason = None
            if status == "dead":
                error, reason = rng.choice(ERRORS), rng.choice(REASONS)
            elif rng.random() < 0.05:
                error = rng.choice(ERRORS)
            r = rng.random()
            prio = 1 if r < 0.7 else (0 if r < 0.9 else 2)
            yield (
                job_id,
                job_type,
                shard_for(job_type, SHARDS),
                prio,
                payload,
                status,
                created + (3_600_000 if status == "delayed" else 0),
                created + 60_000 if status == "leased" else None,
                0 if status in ("delayed", "ready") else 1,
                1 if error else 0,
                5,
                60_000,
                f"{key_prefix}-{k}" if rng.random() < 0.05 else None,
                error,
                reason,
                created,
                created + 5 if status not in ("delayed", "ready") else None,
                created + 50 if finished else None,
                created + 50,
                rng.choice(SCHEDULES) if rng.random() < 0.02 else None,
            )


def _secondary_indexes(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Each index of jobs but the primary key, with the statement that builds it on every partition
    (a partitioned table's definition says ON ONLY, which builds the parent's alone)."""
    return [
        (str(name), str(sql).replace(" ON ONLY ", " ON ", 1))
        for name, sql in conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs' AND indexname <> 'jobs_pkey'"
        ).fetchall()
    ]


def fill(db_url: str, rows: int) -> None:
    now = int(time.time() * 1000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        indexes = _secondary_indexes(conn)
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        # The dead-letter counts' row triggers (migration 0006) would fire once per dead row at the
        # end of the COPY, each updating one of a few rows again and again in one transaction: off,
        # and the counts made once after.
        conn.execute("ALTER TABLE jobs DISABLE TRIGGER USER")
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f"COPY jobs ({COLUMNS}) FROM STDIN") as copy:
            for n, row in enumerate(_rows(rows, now, seed=19), 1):
                copy.write_row(row)
                if n % 1_000_000 == 0:
                    print(f"   {n:,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
        print(f"1. COPY of {rows:,} rows: {time.perf_counter() - started:.0f} s")
        conn.execute("ALTER TABLE jobs ENABLE TRIGGER USER")
        conn.execute(
            "INSERT INTO dead_counts (type, priority, n) SELECT type, priority, COUNT(*) FROM jobs "
            "WHERE status = 'dead' GROUP BY type, priority "
            "ON CONFLICT (type, priority) DO UPDATE SET n = excluded.n"
        )
        conn.execute("SET maintenance_work_mem = '256MB'")
        print("   index builds on the filled table (CREATE INDEX, one at a time):")
        for name, sql in indexes:
            started = time.perf_counter()
            conn.execute(sql)
            size = conn.execute(  # a partitioned index's size is its partitions'
                "SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree(%s::regclass)", (name,)
            ).fetchone()[0]  # type: ignore[index]
            print(f"   {name:24} {time.perf_counter() - started:6.1f} s  {size / 2**20:7.0f} MiB")
        started = time.perf_counter()
        conn.execute("VACUUM (ANALYZE) jobs")
        print(f"   VACUUM ANALYZE {time.perf_counter() - started:.0f} s")


def _filters(now_ms: int) -> list[tuple[str, pb.JobFilter]]:
    hour = 3_600_000
    f = pb.JobFilter
    payload = pb.PayloadMatch
    return [
        ("(none)", f()),
        ("type = billing.charge (25%)", f(types=["billing.charge"])),
        ("type = tenant.sync7 (0.65%)", f(types=["tenant.sync7"])),
        ("type = billing.rare (0.001%)", f(types=["billing.rare"])),
        ("type ~ billing.* (35%)", f(type_patterns=["billing.*"])),
        ("type ~ tenant.sync1* (11 types)", f(type_patterns=["tenant.sync1*"])),
        ("state = dead (3%)", f(statuses=[pb.JOB_STATUS_DEAD])),
        ("state = cancelled (1%)", f(statuses=[pb.JOB_STATUS_CANCELLED])),
        ("state = ready (2%)", f(statuses=[pb.JOB_STATUS_READY])),
        ("state in delayed, ready", f(statuses=[pb.JOB_STATUS_DELAYED, pb.JOB_STATUS_READY])),
        ("priority = low (10%)", f(priorities=[pb.PRIORITY_LOW])),
        ("created in the last hour", f(created_after_ms=now_ms - hour)),
        (
            "created 1 h, 3 days ago",
            f(created_after_ms=now_ms - 3 * DAY_MS, created_before_ms=now_ms - 3 * DAY_MS + hour),
        ),
        ("finished in the last hour", f(finished_after_ms=now_ms - hour)),
        ("finished in the last day", f(finished_after_ms=now_ms - DAY_MS)),
        (
            "finished 1 h, 3 days ago",
            f(finished_after_ms=now_ms - 3 * DAY_MS, finished_before_ms=now_ms - 3 * DAY_MS + hour),
        ),
        ("type + finished last day", f(types=["email.send"], finished_after_ms=now_ms - DAY_MS)),
        ("rare type + finished last day", f(types=["billing.rare"], finished_after_ms=now_ms - DAY_MS)),
        (
            "tenant.sync1* + finished last day",
            f(type_patterns=["tenant.sync1*"], finished_after_ms=now_ms - DAY_MS),
        ),
        ("idempotency key (no type)", f(idempotency_key="key-5000020")),
        ("schedule = hourly-sync (0.7%)", f(schedule="hourly-sync")),
        ("dead reason = lease_expired", f(dead_reason=pb.DEAD_REASON_LEASE_EXPIRED)),
        ("error ~ 'card declined' (2%)", f(error_contains="card declined")),
        ("error ~ 'no such text' (none)", f(error_contains="no such text")),
        ("payload.customer_id = 1 (common)", f(payload=[payload(path="customer_id", value_json="1")])),
        ("payload.customer_id = 4242 (rare)", f(payload=[payload(path="customer_id", value_json="4242")])),
        ("type + state dead", f(types=["billing.charge"], statuses=[pb.JOB_STATUS_DEAD])),
        (
            "billing.* + dead + last day",
            f(type_patterns=["billing.*"], statuses=[pb.JOB_STATUS_DEAD], created_after_ms=now_ms - DAY_MS),
        ),
        ("state dead + error text", f(statuses=[pb.JOB_STATUS_DEAD], error_contains="Timeout")),
        (
            "type + payload.customer_id = 4242",
            f(types=["billing.charge"], payload=[payload(path="customer_id", value_json="4242")]),
        ),
    ]


async def _time_filters(db_url: str, label: str, only: set[str] | None = None) -> None:
    store = PostgresStore(db_url, max_size=2)
    await store.open()
    now_ms = int(time.time() * 1000)
    print(f"\n{label}")
    print(f"   {'filter':38} {'order':6} {'first':>8} {'median':>8} {'rows':>5}  plan")
    slow = 0
    try:
        for name, message in _filters(now_ms):
            if only is not None and name not in only:
                continue
            search = job_filter.parse(message)
            known = await store.job_types() if search.needs_known_types(False) else []
            query = search.resolve(known, lambda t: True, False)
            for newest_first in (True, False):
                times = []
                rows: list[Any] = []
                order = "newest" if newest_first else "oldest"
                plan = await _plan(store, query, newest_first)
                try:
                    for _ in range(6):
                        started = time.perf_counter()
                        rows = await store.search_jobs(query, PAGE, newest_first=newest_first)
                        times.append((time.perf_counter() - started) * 1000)
                except SearchTooSlow:
                    slow += 1
                    print(f"   {name:38} {order:6} stopped at {SEARCH_TIMEOUT_MS} ms  {plan}", flush=True)
                    continue
                median = statistics.median(times[1:])
                slow += median > 100
                print(
                    f"   {name:38} {order:6} {times[0]:8.1f} {median:8.1f} {len(rows):5}  {plan}", flush=True
                )
    finally:
        await store.close()
    print(f"   {slow} first page(s) over 100 ms (median)")


async def _plan(store: PostgresStore, query: Any, newest_first: bool) -> str:
    """The plan's node under the Limit: the index it walks, or the merge of one scan per type."""
    sql, params = query.page_statement("postgres", "id, finished_at", PAGE, "", newest_first)
    async with store.transaction() as tx:
        rows = await tx.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)

    def describe(node: dict[str, Any]) -> str:
        while node.get("Node Type") in ("Limit", "Subquery Scan", "Sort") and node.get("Plans"):
            node = node["Plans"][0]
        if node["Node Type"] in ("Append", "Merge Append"):
            return f"{node['Node Type']} of {len(node['Plans'])}: {describe(node['Plans'][0])}"
        index = node.get("Index Name")
        return f"{node['Node Type']}{' ' + index if index else ''}"

    return describe(rows[0][0][0]["Plan"])


#: The indexes whose write cost step 3 measures, by the migration that added them.
MEASURED_INDEXES = {
    "0013": ("jobs_type_id", "jobs_schedule_id"),
    "0019": ("jobs_finished_at", "jobs_dead_reason"),
}


def write_amplification(db_url: str, migration: str) -> None:
    """Insert 100,000 jobs and run them through three status updates (leased, succeeded,
    cancelled, the last two with a finish time), with and without the migration's indexes, on the
    filled table."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        indexes = {n: s for n, s in _secondary_indexes(conn) if n in MEASURED_INDEXES[migration]}
        results = {}
        for with_search in (True, False, True):
            if not with_search:
                for name in indexes:
                    conn.execute(f"DROP INDEX {name}")
            elif not {n for n, _ in _secondary_indexes(conn)} >= set(indexes):
                for sql in indexes.values():
                    conn.execute(sql)
            now = int(time.time() * 1000) + WEEK_MS  # ids after every existing one, as new jobs are
            rows = list(_rows(100_000, now, seed=len(results), key_prefix=f"new{len(results)}"))
            ids = [r[0] for r in rows]
            started = time.perf_counter()
            copy_sql = f"COPY jobs ({COLUMNS}) FROM STDIN"
            with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
            insert_s = time.perf_counter() - started
            started = time.perf_counter()
            for status in ("leased", "succeeded", "cancelled"):
                for i in range(0, len(ids), 1000):
                    conn.execute(
                        "UPDATE jobs SET status = %s, updated_at = %s, finished_at = %s "
                        "FROM unnest(%s::text[]) AS v(id) WHERE jobs.id = v.id",
                        (status, now, None if status == "leased" else now, ids[i : i + 1000]),
                    )
            update_s = time.perf_counter() - started
            conn.execute("DELETE FROM jobs WHERE id = ANY(%s)", (ids,))
            results[len(results)] = (with_search, insert_s, update_s)
            print(
                f"   {'with' if with_search else 'without'} {migration}'s indexes: insert {insert_s:.2f} s, "
                f"3 updates {update_s:.2f} s",
                flush=True,
            )
        with_runs = [r for r in results.values() if r[0]]
        without = next(r for r in results.values() if not r[0])
        insert = statistics.mean(r[1] for r in with_runs) / without[1]
        update = statistics.mean(r[2] for r in with_runs) / without[2]
        print(f"   with / without: insert {insert:.2f}x, status updates {update:.2f}x")


async def _payload_index(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(
            "CREATE INDEX IF NOT EXISTS jobs_payload_customer_id ON jobs "
            "((shardq_payload_json(payload) #> '{customer_id}'), id)"
        )
        size = conn.execute(
            "SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree('jobs_payload_customer_id')"
        ).fetchone()[0]  # type: ignore[index]
        conn.execute("ANALYZE jobs")
        print(
            f"\n   the advised expression index on payload.customer_id: built in "
            f"{time.perf_counter() - started:.0f} s, {size / 2**20:.0f} MiB"
        )
    names = {n for n, _ in _filters(0) if "payload" in n}
    await _time_filters(db_url, "2b. payload filters with the expression index", names)


async def _error_index(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'").fetchone():
            print("\n   pg_trgm is not installed: no trigram index measured")
            return
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        started = time.perf_counter()
        conn.execute(
            "CREATE INDEX IF NOT EXISTS jobs_last_error_trgm ON jobs USING gin (last_error gin_trgm_ops)"
        )
        size = conn.execute(
            "SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree('jobs_last_error_trgm')"
        ).fetchone()[0]  # type: ignore[index]
        conn.execute("ANALYZE jobs")
        print(
            f"\n   the advised trigram index on last_error: built in "
            f"{time.perf_counter() - started:.0f} s, {size / 2**20:.0f} MiB"
        )
    names = {n for n, _ in _filters(0) if "error" in n}
    try:
        await _time_filters(db_url, "2c. error text filters with the trigram index", names)
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DROP INDEX jobs_last_error_trgm")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--db-url", help="a database filled before (with --skip-fill) or to fill")
    parser.add_argument("--skip-fill", action="store_true")
    parser.add_argument("--keep", action="store_true", help="leave the database made")
    parser.add_argument(
        "--steps",
        default="filters,payload,error,writes",
        help="which measurements after the fill (default all): filters, payload, error, writes",
    )
    args = parser.parse_args()
    postgres = database = None
    db_url = args.db_url
    if db_url is None:
        postgres = Postgres().start()
        database = postgres.new_database()
        db_url = database.url
        print(f"database: {db_url}")
    try:
        store = PostgresStore(db_url, max_size=1)
        asyncio.run(_migrate(store))
        if not args.skip_fill:
            fill(db_url, args.rows)
        with psycopg.connect(db_url, autocommit=True) as conn:
            n = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'jobs'").fetchone()[0]  # type: ignore[index]
        steps = set(args.steps.split(","))
        if "filters" in steps:
            asyncio.run(_time_filters(db_url, f"2. first page ({PAGE} jobs) of each filter, ~{n:,} rows, ms"))
        if "payload" in steps:
            asyncio.run(_payload_index(db_url))
        if "error" in steps:
            asyncio.run(_error_index(db_url))
        if "writes" in steps:
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("DROP INDEX IF EXISTS jobs_payload_customer_id")
            for migration in MEASURED_INDEXES:
                print(f"\n3. write amplification of migration {migration}'s indexes (100,000 jobs)")
                write_amplification(db_url, migration)
    finally:
        if database is not None and not args.keep:
            database.drop()
        if postgres is not None:
            postgres.stop()


async def _migrate(store: PostgresStore) -> None:
    await store.open()
    try:
        await store.migrate()
        await store.ensure_shard_count(SHARDS)
        # Daily partitions over the rows' week, as a dispatcher keeps them (its default interval).
        now = int(time.time() * 1000)
        await store.ensure_partitions(now - WEEK_MS - DAY_MS, now + DAY_MS, DAY_MS)
    finally:
        await store.close()


if __name__ == "__main__":
    main()

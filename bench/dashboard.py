"""The dashboard's pages and API, timed on the server side, with a big jobs table.

    python -m bench.dashboard [--rows 1000000] [--db-url URL [--skip-fill]] [--keep] [--runs 5]

Fills a fresh PostgreSQL database with ``--rows`` jobs as ``bench.search`` does (its realistic mix,
by COPY), starts a dispatcher on it (a private Redis, one process; it restores the active jobs into
Redis first), then requests every page and JSON endpoint of the dashboard through its ASGI app in
this process (no HTTP socket: the time is the dashboard's and the gRPC calls it makes), a first time
and then ``--runs`` times, and prints the first and the median in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

from dispatcher.dashboard.app import build_app
from dispatcher.dashboard.settings import DashboardSettings
from dispatcher.store.postgres import PostgresStore

from .infra.dispatcher import Dispatcher
from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis
from .search import SHARDS, _migrate, fill

#: (label, path): what a user opens. The job page's id is filled in from the search's first hit.
ROUTES = [
    ("overview page", "/"),
    ("overview sample (API)", "/api/overview"),
    ("queues page", "/queues"),
    ("jobs page, no filter", "/jobs"),
    ("jobs page, type billing.charge, dead", "/jobs?type=billing.charge&status=dead"),
    ("jobs page, payload customer_id = 42", "/jobs?payload=customer_id+%3D+42"),
    ("jobs page, error contains 'declined'", "/jobs?error=declined"),
    ("jobs API, type pattern billing.*", "/api/jobs?type=billing.*"),
    ("job page", "/jobs/{id}"),
    ("dead letters page", "/dead"),
    ("dead letters, type email.send", "/dead?type=email.send"),
    ("dead count (dry run, API)", "/api/dead/count?type=report.build"),
    ("schedules page", "/schedules"),
    ("workers and shards page", "/workers"),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--db-url", help="a database filled before (with --skip-fill) or to fill")
    parser.add_argument("--skip-fill", action="store_true")
    parser.add_argument("--keep", action="store_true", help="leave the database made")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    postgres = database = None
    db_url = args.db_url
    if db_url is None:
        postgres = Postgres().start()
        database = postgres.new_database()
        db_url = database.url
    redis = PrivateRedis().start()
    dispatcher = None
    try:
        asyncio.run(_migrate(PostgresStore(db_url, max_size=1)))
        if not args.skip_fill:
            t0 = time.monotonic()
            fill(db_url, args.rows)
            print(f"filled {args.rows:,} rows in {time.monotonic() - t0:.0f} s")
        logs = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
        t0 = time.monotonic()
        dispatcher = Dispatcher(redis.url, db_url, logs, 1, shard_count=SHARDS).start(timeout=600)
        print(f"dispatcher ready in {time.monotonic() - t0:.0f} s")
        app = build_app(DashboardSettings(target=dispatcher.target))
        with TestClient(app, base_url="http://127.0.0.1") as web:
            found = web.get("/api/jobs?limit=1")
            if found.status_code != 200:
                raise SystemExit(f"/api/jobs: {found.status_code} {found.text[:300]}")
            first = found.json()["jobs"][0]["id"]
            print(f"\nserver-side times, {args.rows:,} jobs in the DB, ms (first / median of {args.runs})")
            for label, path in ROUTES:
                path = path.replace("{id}", first)
                times = []
                for _ in range(args.runs + 1):
                    t = time.perf_counter()
                    reply = web.get(path)
                    times.append((time.perf_counter() - t) * 1000)
                    if reply.status_code != 200:
                        raise SystemExit(f"{path}: {reply.status_code} {reply.text[:300]}")
                print(f"  {label:40} {times[0]:8.1f} {statistics.median(times[1:]):8.1f}")
    finally:
        if dispatcher is not None:
            dispatcher.stop()
        redis.stop()
        if database is not None and not args.keep:
            database.drop()
        if postgres is not None:
            postgres.stop()


if __name__ == "__main__":
    main()

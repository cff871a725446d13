"""PostgreSQL for shardq's store: SHARDQ_TEST_PG_URL, else the local server at 127.0.0.1:5432,
else a throwaway cluster. Each stack gets a fresh database, dropped afterwards."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.support.pg_cluster import PgCluster
from tests.support.postgres import TempDatabase, admin_url


class Postgres:
    def __init__(self, private: bool = False) -> None:
        """``private``: always a throwaway cluster, for figures of the whole server (its WAL)."""
        self.private = private
        self.admin: str | None = None
        self.source = ""
        self.cluster: PgCluster | None = None

    def start(self) -> Postgres:
        self.admin, self.source = (None, "") if self.private else admin_url()
        if self.admin is None:
            # The throwaway cluster runs with fsync=off: its commits are not durable, which the
            # results say (settings below).
            self.cluster = PgCluster().start()
            self.admin, self.source = self.cluster.url, "a throwaway cluster started for the run"
        return self

    def start_private(self) -> Postgres:
        """A throwaway cluster of its own, whatever else runs: a measure of WAL (which a server
        counts for all its databases) sees only the run's own writes."""
        self.cluster = PgCluster().start()
        self.admin, self.source = self.cluster.url, "a throwaway cluster of its own (fsync=off)"
        return self

    def new_database(self) -> TempDatabase:
        assert self.admin is not None, "start() first"
        database = TempDatabase(self.admin, prefix="shardq_bench")
        database.create()
        return database

    def describe(self) -> dict[str, Any]:
        assert self.admin is not None, "start() first"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("server_version", "fsync", "synchronous_commit", "wal_level")
            }
        return {"source": self.source, **settings}

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()

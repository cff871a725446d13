"""The table keeper in a real dispatcher process on PostgreSQL: at its start the partitions of the
jobs table are there before the first enqueue (today's and three ahead), its jobs land in them, and
/metrics reports the partitions and the tables' size. Retirement itself is driven with old ids in
tests/integration/test_partitions.py."""

from __future__ import annotations

import pytest

from tests.support.db import query
from tests.support.ports import free_port
from tests.support.scrape import metric_total
from tests.support.wait import wait_until
from worker_sdk import Client

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def test_a_dispatcher_keeps_partitions_ahead_and_reports_them(start_dispatcher, redis_url, db_url):
    port = free_port()
    proc = start_dispatcher(
        redis_url, db_url, partition_check_interval="1s", metrics_listen=f"127.0.0.1:{port}"
    )
    partitions = {
        r[0]
        for r in query(
            db_url,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'jobs'::regclass",
        )
    }
    assert len({p for p in partitions if p.startswith("jobs_p")}) == 4 and "jobs_default" in partitions
    with Client(proc.target) as client:
        ids = [client.enqueue("mail.send", {"i": i}, idempotency_key=f"k{i}") for i in range(20)]
        assert client.enqueue("mail.send", {}, idempotency_key="k3") == ids[3]
    where = {r[0] for r in query(db_url, "SELECT tableoid::regclass::text FROM jobs")}
    assert len(where) == 1 and where.pop().startswith("jobs_p")
    wait_until(
        lambda: (
            metric_total(port, "shardq_db_partitions", kind="ahead") == 3
            and metric_total(port, "shardq_db_table_bytes", table="jobs") > 0
            and metric_total(port, "shardq_db_table_bytes", table="job_idem_keys") > 0
        ),
        timeout=20,
        message="partition and size gauges",
    )
    assert metric_total(port, "shardq_db_partitions", kind="default") == 1

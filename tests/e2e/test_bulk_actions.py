"""Bulk actions by filter (BulkJobs, ``dispatcherctl jobs cancel|requeue|run-now|delete``) on a real
dispatcher, Redis, workers and both stores: each action's dry run counts and changes nothing; the
action changes exactly the jobs the filter selects among those it applies to, as its single-job path
would (a cancelled job never runs, a requeued dead job runs, a job delayed far ahead runs now, a
deleted finished row is gone, Redis and the DB agree); limits and ``more``; admins only."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import redis

from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from shardmap import shard_for
from shardq_common.clock import wall_ms
from shardq_common.tls import ChannelSecurity
from tests.support.db import query, statuses
from tests.support.processes import ROOT, read_ledger
from tests.support.wait import wait_until
from worker_sdk import Client, JobFilter, ShardqError

SHARDS = 8  # the e2e dispatchers' shard count
ADMIN = "bulk-admin-token-000001"
PRODUCER = "bulk-producer-token-001"


def ctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
        env=dict(os.environ),
    )


def _record(redis_url: str, job_type: str, job_id: str) -> JobRecord | None:
    r = redis.Redis.from_url(redis_url)
    try:
        raw = r.hget(ShardKeys(shard_for(job_type, SHARDS)).jobs, job_id)
    finally:
        r.close()
    return JobRecord.unpack(raw) if raw else None


def _started(ledger) -> list[str]:
    return [e["job"] for e in read_ledger(ledger) if e["event"] == "start"] if ledger.exists() else []


def test_cancel_by_filter_counts_first_and_a_cancelled_job_never_runs(
    dispatcher, redis_url, db_url, start_worker, ledger
):
    with Client(dispatcher.target) as client:
        ids = [client.enqueue("noop.bulk", {"customer_id": i % 2}, delay=2) for i in range(8)]
        ready = client.enqueue("noop.bulk", {"customer_id": 1})
        other = client.enqueue("noop.other", {"customer_id": 1}, delay=2)
        chosen = JobFilter(types=("noop.bulk",), payload={"customer_id": 1})
        picked = {ids[1], ids[3], ids[5], ids[7], ready}

        dry = client.bulk_jobs("cancel", chosen, dry_run=True)
        assert (dry.matched, dry.touched, dry.more) == (5, 0, False)
        assert set(statuses(db_url, list(picked)).values()) <= {"delayed", "ready"}
        # Limits: two at a time, and more says there are others.
        first = client.bulk_jobs("cancel", chosen, limit=2)
        assert (first.matched, first.touched, first.more) == (2, 2, True)
        rest = client.bulk_jobs("cancel", chosen)
        assert (rest.matched, rest.touched, rest.more) == (3, 3, False)
        assert client.bulk_jobs("cancel", chosen, dry_run=True).matched == 0  # none left to cancel

        assert set(statuses(db_url, list(picked)).values()) == {"cancelled"}
        for job_id in picked:
            record = _record(redis_url, "noop.bulk", job_id)
            assert record is None or record.state == "cancelled"
        start_worker(dispatcher.target, types="noop.bulk,noop.other")
        kept = set(ids) - picked | {other}
        wait_until(
            lambda: set(statuses(db_url, list(kept)).values()) == {"succeeded"},
            timeout=20,
            message="the jobs not cancelled ran",
        )
        assert not picked & set(_started(ledger)), "a cancelled job ran"


def test_requeue_by_filter_runs_dead_jobs_again(dispatcher, db_url, start_worker, ledger):
    with Client(dispatcher.target) as client:
        dead = [client.enqueue("flaky.bulk", {"fail_times": 1, "n": i}, max_attempts=1) for i in range(3)]
        start_worker(dispatcher.target, types="flaky.bulk")
        wait_until(
            lambda: set(statuses(db_url, dead).values()) == {"dead"}, timeout=20, message="dead-lettered"
        )
        only_two = JobFilter(types=("flaky.*",), payload={"n": 1})
        assert client.bulk_jobs("requeue", only_two, dry_run=True).matched == 1
        assert client.bulk_jobs("requeue", JobFilter(statuses=("succeeded",))).matched == 0
        result = client.bulk_jobs("requeue", JobFilter(types=("flaky.bulk",), error_contains="flaky failure"))
        assert (result.matched, result.touched) == (3, 3)
        wait_until(
            lambda: set(statuses(db_url, dead).values()) == {"succeeded"},
            timeout=20,
            message="requeued jobs ran and succeeded",
        )
        assert all(_started(ledger).count(j) == 2 for j in dead)


def test_run_now_runs_a_job_delayed_far_ahead_now(dispatcher, redis_url, db_url, start_worker, ledger):
    with Client(dispatcher.target) as client:
        far = [client.enqueue("noop.later", {"i": i}, delay=30 * 86_400) for i in range(3)]
        untouched = client.enqueue("noop.later", {"i": 9}, delay=30 * 86_400)
        # Calls go on after the last job the previous one selected, whatever became of it.
        all_four = JobFilter(types=("noop.later",))
        first = client.bulk_jobs("run_now", all_four, dry_run=True, limit=3)
        assert (first.matched, first.more, first.last_id) == (3, True, sorted([*far, untouched])[2])
        rest = client.bulk_jobs("run_now", all_four, dry_run=True, limit=3, after_id=first.last_id)
        assert (rest.matched, rest.more, rest.last_id) == (1, False, max(*far, untouched))
        start_worker(dispatcher.target, types="noop.later")
        chosen = JobFilter(types=("noop.later",), payload={"i": 0})
        assert client.bulk_jobs("run_now", chosen, dry_run=True).matched == 1
        assert _record(redis_url, "noop.later", far[0]).run_at_ms > wall_ms() + 86_400_000  # type: ignore[union-attr]
        before = wall_ms()
        result = client.bulk_jobs("run_now", chosen)
        assert (result.matched, result.touched) == (1, 1)
        wait_until(lambda: client.get_job(far[0]).status == "succeeded", timeout=10, message="ran now")
        for i in (1, 2):
            assert (
                client.bulk_jobs("run_now", JobFilter(types=("noop.later",), payload={"i": i})).touched == 1
            )
        wait_until(
            lambda: {client.get_job(j).status for j in far} == {"succeeded"}, timeout=10, message="all ran"
        )
        assert client.get_job(untouched).status == "delayed"
        starts = {e["job"]: e["t"] for e in read_ledger(ledger) if e["event"] == "start"}
        assert starts[far[0]] * 1000 < before + 10_000 and untouched not in starts
        # Not a delayed job any more: nothing to do.
        assert (
            client.bulk_jobs("run_now", JobFilter(types=("noop.later",), statuses=("succeeded",))).matched
            == 0
        )


def test_delete_by_filter_removes_finished_rows_only(dispatcher, db_url, start_worker, ledger):
    with Client(dispatcher.target) as client:
        done = [client.enqueue("noop.gone", {"i": i}) for i in range(4)]
        start_worker(dispatcher.target, types="noop.gone")
        wait_until(lambda: set(statuses(db_url, done).values()) == {"succeeded"}, timeout=20, message="ran")
        waiting = client.enqueue("noop.gone", {"i": 9}, delay=3600)
        everything = JobFilter(types=("noop.gone",))
        wait_until(
            lambda: client.bulk_jobs("delete", everything, dry_run=True).matched == 4,
            timeout=10,
            message="finished rows counted",
        )
        wait_until(
            lambda: (
                client.bulk_jobs("delete", everything).touched > 0
                and not query(db_url, "SELECT id FROM jobs WHERE type = 'noop.gone' AND status = 'succeeded'")
            ),
            timeout=15,
            message="finished rows deleted (once Redis forgot them)",
        )
        assert [r[0] for r in query(db_url, "SELECT id FROM jobs WHERE type = 'noop.gone'")] == [waiting]
        try:
            client.get_job(done[0])
        except ShardqError as exc:
            assert exc.code is grpc.StatusCode.NOT_FOUND
        else:
            raise AssertionError("a deleted job is still found")


def test_bulk_actions_are_the_admins_and_bad_requests_change_nothing(start_dispatcher, redis_url, db_url):
    tokens = f"{ADMIN} role=admin;{PRODUCER} role=producer"
    proc = start_dispatcher(redis_url, db_url, auth_tokens=tokens, security=ChannelSecurity(token=ADMIN))
    with Client(proc.target, token=ADMIN) as admin, Client(proc.target, token=PRODUCER) as producer:
        job = producer.enqueue("noop.perm", {}, delay=3600)
        for action in ("cancel", "requeue", "run_now", "delete"):
            try:
                producer.bulk_jobs(action, JobFilter(types=("noop.perm",)), dry_run=True)
            except ShardqError as exc:
                assert exc.code is grpc.StatusCode.PERMISSION_DENIED
            else:
                raise AssertionError(f"a producer ran a bulk {action}")
        for call, field in (
            (lambda: admin.bulk_jobs("cancel", limit=100_001), "limit"),
            (lambda: admin.bulk_jobs("cancel", after_id="not an id\n"), "after_id"),
            (lambda: admin.bulk_jobs("cancel", JobFilter(payload={"a b": 1})), "filter.payload[0].path"),
        ):
            try:
                call()
            except ShardqError as exc:
                assert exc.code is grpc.StatusCode.INVALID_ARGUMENT and exc.details.startswith(field), (
                    exc.details
                )
            else:
                raise AssertionError("a bad request was taken")
        assert producer.get_job(job).status == "delayed"
        assert admin.bulk_jobs("cancel", JobFilter(types=("noop.perm",))).touched == 1


def test_dispatcherctl_bulk_commands_count_without_yes(dispatcher, db_url):
    with Client(dispatcher.target) as client:
        ids = [client.enqueue("noop.cli", {"customer_id": 7}, delay=3600) for _ in range(3)]
    counted = ctl(dispatcher.target, "jobs", "cancel", "--type", "noop.*", "--payload", "customer_id=7")
    assert counted.returncode == 0 and "3 job(s) would be cancelled" in counted.stdout, counted
    assert "--yes" in counted.stdout and set(statuses(db_url, ids).values()) == {"delayed"}
    dry = ctl(dispatcher.target, "jobs", "run-now", "--type", "noop.cli", "--dry-run", "--yes", "--json")
    assert dry.returncode == 0 and '"would_touch": 3' in dry.stdout, dry
    done = ctl(dispatcher.target, "jobs", "cancel", "--type", "noop.cli", "--yes")
    assert done.returncode == 0 and "3 job(s) cancelled" in done.stdout, done
    assert set(statuses(db_url, ids).values()) == {"cancelled"}
    bad = ctl(dispatcher.target, "jobs", "delete", "--state", "nope")
    assert bad.returncode == 2 and "--state" in bad.stderr

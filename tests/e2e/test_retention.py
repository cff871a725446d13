"""Retention end to end, on real dispatcher processes with SQLite and PostgreSQL: the shard owner's
pruner deletes the finished rows past their period (per status, per type), never an active job and
never one whose finished record Redis still holds; an idempotency key whose job was deleted makes a
new job; ``dispatcherctl queue retention`` sets a type's periods and ``dispatcherctl jobs prune``
deletes by hand (a dry run counts; bad input is refused and deletes nothing).

Finished rows are made old by moving their finished_at back in the DB: the pruner reads nothing
else about a row's age."""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from shardmap import shard_for
from shardq_common.clock import wall_ms
from tests.support.db import query
from tests.support.ports import free_port
from tests.support.processes import ROOT
from tests.support.scrape import metric_total
from tests.support.wait import wait_until
from worker_sdk import Client

SHARDS = 8  # the e2e dispatchers' shard count
DAY_MS = 86_400_000
PASS_BOUND_S = 20.0  # a pass a second (SHARDQ_RETENTION_INTERVAL=1s), the first within 1 s


def ctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def _in_redis(redis_url: str, job_type: str, job_id: str) -> bool:
    r = redis.Redis.from_url(redis_url)
    try:
        return bool(r.hexists(ShardKeys(shard_for(job_type, SHARDS)).jobs, job_id))
    finally:
        r.close()


def _finished(client: Client, redis_url: str, job_type: str, n: int, **options: object) -> list[str]:
    """n jobs of the type cancelled (finished), their status written and their records forgotten."""
    ids = [client.enqueue(job_type, {"i": i}, delay=3600, **options) for i in range(n)]  # type: ignore[arg-type]
    for job_id in ids:
        assert client.cancel(job_id) == "cancelled"
    wait_until(
        lambda: all(
            client.get_job(j).status == "cancelled" and not _in_redis(redis_url, job_type, j) for j in ids
        ),
        timeout=15,
        message="cancelled jobs written and forgotten",
    )
    return ids


def _age(db_url: str, ids: list[str], days: float, status: str | None = None) -> None:
    """Make these rows look finished ``days`` ago (and give them ``status``)."""
    marks = ", ".join("?" * len(ids))
    finished = int(wall_ms() - days * DAY_MS)
    if status:
        query(
            db_url,
            f"UPDATE jobs SET status = ?, finished_at = ? WHERE id IN ({marks})",
            (status, finished, *ids),
        )
    else:
        query(db_url, f"UPDATE jobs SET finished_at = ? WHERE id IN ({marks})", (finished, *ids))


def _left(db_url: str, ids: list[str]) -> set[str]:
    marks = ", ".join("?" * len(ids))
    return {r[0] for r in query(db_url, f"SELECT id FROM jobs WHERE id IN ({marks})", tuple(ids))}


def _pruned(port: int, keys: dict[tuple[str, str], int]) -> dict[tuple[str, str], float]:
    return {
        (job_type, status): metric_total(port, "shardq_jobs_pruned_total", type=job_type, status=status)
        for job_type, status in keys
    }


def test_the_owner_prunes_exactly_the_rows_past_their_period(start_dispatcher, redis_url, db_url):
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, retention_interval="1s", metrics_listen=f"127.0.0.1:{port}")
    job_type, short = "report.build", "report.short"
    with Client(proc.target) as client:
        assert (
            ctl(proc.target, "queue", "retention", short, "--succeeded", "1h", "--dead", "2h").returncode == 0
        )
        done_old, done_young = (
            _finished(client, redis_url, job_type, 3),
            _finished(client, redis_url, job_type, 2),
        )
        dead_old, dead_young = (
            _finished(client, redis_url, job_type, 2),
            _finished(client, redis_url, job_type, 2),
        )
        short_old, short_dead = _finished(client, redis_url, short, 2), _finished(client, redis_url, short, 1)
        keyed = _finished(client, redis_url, job_type, 1, idempotency_key="once")
        waiting = client.enqueue(job_type, {}, delay=3600)  # delayed: never pruned, whatever its times
        _age(db_url, done_old + keyed, 8)
        _age(db_url, done_young, 6)
        _age(db_url, dead_old, 31, "dead")
        _age(db_url, dead_young, 29, "dead")
        _age(db_url, short_old, 2 / 24)  # 2 h: past the type's own 1 h, far inside the default 7 d
        _age(db_url, short_dead, 3 / 24, "dead")
        query(db_url, "UPDATE jobs SET finished_at = ? WHERE id = ?", (wall_ms() - 90 * DAY_MS, waiting))
        # A finished row whose record Redis still holds (its status write's forget is yet to come).
        # The record goes back before the row is made old: the other order leaves a pass between.
        held = _finished(client, redis_url, job_type, 1)
        record = JobRecord(job_type, Priority.DEFAULT, JobState.CANCELLED, 1, 1, 5, 60_000)
        r = redis.Redis.from_url(redis_url)
        r.hset(ShardKeys(shard_for(job_type, SHARDS)).jobs, held[0], record.pack())
        _age(db_url, held, 9)

        gone = done_old + keyed + dead_old + short_old + short_dead
        wait_until(lambda: not _left(db_url, gone), timeout=PASS_BOUND_S, message="old rows pruned")
        kept = done_young + dead_young + [waiting] + held
        assert _left(db_url, kept) == set(kept)
        # A pass counts its deletes after they commit: the counts are read once they are all in.
        expected = {(job_type, "cancelled"): 4, (job_type, "dead"): 2, (short, "dead"): 1}
        wait_until(
            lambda: _pruned(port, expected) == expected,
            timeout=PASS_BOUND_S,
            message=lambda: f"pruned counts {_pruned(port, expected)}, expected {expected}",
        )
        # The held row goes once its record is forgotten.
        r.hdel(ShardKeys(shard_for(job_type, SHARDS)).jobs, held[0])
        r.close()
        wait_until(
            lambda: not _left(db_url, held), timeout=PASS_BOUND_S, message="held row pruned once forgotten"
        )
        # Its key's job is gone: the same key makes a new job.
        again = client.enqueue(job_type, {}, idempotency_key="once")
        assert again != keyed[0] and client.get_job(again).status in ("ready", "leased")
        # The gauges are set at a pass's end, after its deletes: the pass that pruned the held row
        # may still be on its way to setting them when the row is seen gone.
        wait_until(
            lambda: metric_total(port, "shardq_retention_overdue_seconds") == 0,
            timeout=PASS_BOUND_S,
            message=lambda: f"overdue {metric_total(port, 'shardq_retention_overdue_seconds')} s, expected 0",
        )
        assert metric_total(port, "shardq_oldest_finished_job_age_seconds", status="dead") < 30 * 86_400


def test_prune_by_hand_counts_deletes_and_refuses_bad_input(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url, retention_interval="0")  # retention off: only the CLI deletes
    job_type, other = "export.csv", "export.pdf"
    with Client(proc.target) as client:
        old = _finished(client, redis_url, job_type, 5)
        old_dead = _finished(client, redis_url, job_type, 2)
        old_other = _finished(client, redis_url, other, 3)
        young = _finished(client, redis_url, job_type, 2)
        _age(db_url, old + old_other, 3)
        _age(db_url, old_dead, 3, "dead")
        _age(db_url, young, 1)
        everything = old + old_dead + old_other + young

        for bad in (
            ("--older-than", "soon"),
            ("--older-than", "10s"),
            ("--older-than", "-3d"),
            ("--older-than", "2d", "--status", "leased"),
            ("--older-than", "2d", "--type", "bad type!"),
        ):
            result = ctl(proc.target, "jobs", "prune", *bad)
            assert result.returncode != 0, bad
            assert result.stderr.startswith("dispatcherctl: ") and result.stdout == "", (bad, result.stderr)
        assert _left(db_url, everything) == set(everything)

        dry = ctl(proc.target, "--json", "jobs", "prune", "--older-than", "2d", "--dry-run")
        assert dry.returncode == 0 and json.loads(dry.stdout) == {"would_delete": 10}, dry.stderr
        assert (
            "7 finished job(s) of export.csv older than 2d would be deleted"
            in ctl(proc.target, "jobs", "prune", "--older-than", "2d", "--type", job_type, "--dry-run").stdout
        )
        assert _left(db_url, everything) == set(everything)

        dead = ctl(proc.target, "jobs", "prune", "--older-than", "2d", "--status", "dead")
        assert dead.returncode == 0 and "deleted 2 dead job(s)" in dead.stdout, dead.stderr
        assert _left(db_url, old_dead) == set()
        typed = ctl(proc.target, "--json", "jobs", "prune", "--older-than", "2d", "--type", other)
        assert json.loads(typed.stdout) == {"deleted": 3}
        rest = ctl(proc.target, "--json", "jobs", "prune", "--older-than", "2d")
        assert json.loads(rest.stdout) == {"deleted": 5}
        assert _left(db_url, everything) == set(young)


def test_queue_retention_shows_and_sets_a_type_s_periods(dispatcher, redis_url):
    shown = ctl(dispatcher.target, "queue", "retention", "mail.send")
    assert shown.returncode == 0 and "kept cluster default" in shown.stdout
    set_ = ctl(dispatcher.target, "queue", "retention", "mail.send", "--succeeded", "3d", "--dead", "90d")
    assert set_.returncode == 0 and "succeeded and cancelled kept 3d, dead kept 90d" in set_.stdout, (
        set_.stderr
    )
    with Client(dispatcher.target) as client:
        settings = client.get_queue("mail.send").settings
        assert (settings.retain_finished_s, settings.retain_dead_s) == (3 * 86_400, 90 * 86_400)
    # Retention is the pruner's, read from the DB: the lease script's map of the type stays absent.
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.hget(ShardKeys(shard_for("mail.send", SHARDS)).flow, "mail.send") is None
    finally:
        r.close()
    bad = ctl(dispatcher.target, "queue", "retention", "mail.send", "--dead", "5s")
    assert bad.returncode == 2 and "at least a minute" in bad.stderr
    bad = ctl(dispatcher.target, "queue", "retention", "mail.send", "--dead", "20y")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    reset = ctl(dispatcher.target, "queue", "retention", "mail.send", "--succeeded", "default")
    assert reset.returncode == 0 and "kept cluster default, dead kept 90d" in reset.stdout

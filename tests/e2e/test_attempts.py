"""Attempt history end to end (issue 19): each run of a job is kept with its worker, times, outcome,
error and traceback, written by the status writer, shown by GetJob and `dispatcherctl job show`, and
deleted with its job. Real dispatcher and worker processes, Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.db import query
from tests.support.processes import read_ledger
from tests.support.wait import wait_until
from worker_sdk import AttemptInfo, Client, JobInfo

ROOT = Path(__file__).resolve().parents[2]


def _finished(client: Client, job_id: str, status: str, runs: int) -> JobInfo:
    """The job once it has this status and its last run's end is written."""

    def done() -> JobInfo | None:
        job = client.get_job(job_id)
        history = job.attempt_history
        ok = job.status == status and len(history) == runs and history[-1].outcome != "running"
        return job if ok else None

    return wait_until(
        done, timeout=20, message=lambda: f"{client.get_job(job_id).attempt_history} ({status}, {runs} runs)"
    )


def _started(ledger: Path, job_id: str, runs: int = 1) -> bool:
    return sum(1 for e in read_ledger(ledger) if e["event"] == "start" and e["job"] == job_id) >= runs


def _timely(a: AttemptInfo) -> None:
    assert 0 < a.started_at_ms <= a.finished_at_ms


def test_success_and_failure_then_retry_are_kept_per_run(dispatcher, start_worker):
    start_worker(dispatcher.target, types="noop,flaky", worker_id="w-one")
    with Client(dispatcher.target) as client:
        ok = client.enqueue("noop", {"result_hex": "6869"})
        flaky = client.enqueue("flaky", {"fail_times": 1})
        [run] = _finished(client, ok, "succeeded", 1).attempt_history
        assert (run.attempt, run.worker_id, run.outcome, run.error, run.traceback) == (
            1,
            "w-one",
            "succeeded",
            "",
            "",
        )
        _timely(run)
        job = _finished(client, flaky, "succeeded", 2)
        failed, succeeded = job.attempt_history
        assert (failed.attempt, failed.outcome, failed.worker_id) == (1, "failed", "w-one")
        assert failed.error == "RuntimeError: flaky failure on attempt 1"
        assert failed.traceback.startswith("Traceback (most recent call last):")
        assert failed.traceback.rstrip().endswith(failed.error)
        assert (succeeded.attempt, succeeded.outcome) == (2, "succeeded")
        _timely(failed)
        _timely(succeeded)
        assert failed.finished_at_ms <= succeeded.started_at_ms
        assert job.attempts == 2 and job.failures == 1


def test_lease_expired_run_names_the_killed_worker(dispatcher, start_worker, ledger):
    victim = start_worker(dispatcher.target, types="sleep", worker_id="w-victim")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("sleep", {"sleep": 30, "sleep_attempts": 1}, lease_ttl=3)
        wait_until(lambda: _started(ledger, job_id), timeout=20)
        victim.kill()  # SIGKILL: its lease lapses after the reconnect grace
        start_worker(dispatcher.target, types="sleep", worker_id="w-survivor")
        expired, succeeded = _finished(client, job_id, "succeeded", 2).attempt_history
        assert (expired.attempt, expired.worker_id, expired.outcome) == (1, "w-victim", "lease_expired")
        assert (succeeded.attempt, succeeded.worker_id, succeeded.outcome) == (2, "w-survivor", "succeeded")
        _timely(expired)
        assert expired.error == ""


def test_rate_limited_run_is_numbered_without_charging_an_attempt(dispatcher, start_worker):
    start_worker(dispatcher.target, types="limited", worker_id="w-limited")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("limited", {"retry_after": 0.2})
        job = _finished(client, job_id, "succeeded", 2)
        limited, succeeded = job.attempt_history
        assert (limited.attempt, limited.outcome, limited.error) == (1, "rate_limited", "rate limited")
        assert (succeeded.attempt, succeeded.outcome) == (2, "succeeded")
        assert job.attempts == 1 and job.rate_limited == 1


def test_cancel_while_running_ends_the_run_cancelled(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="sleep", worker_id="w-cancel")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("sleep", {"sleep": 30})
        wait_until(lambda: _started(ledger, job_id), timeout=20)
        assert client.cancel(job_id) == "leased"
        [run] = _finished(client, job_id, "cancelled", 1).attempt_history
        assert (run.outcome, run.worker_id, run.error) == ("cancelled", "w-cancel", "cancelled")


def test_traceback_is_bounded_and_keeps_its_end(start_dispatcher, redis_url, db_url, start_worker):
    dispatcher = start_dispatcher(redis_url, db_url, max_traceback_chars=1000)
    start_worker(dispatcher.target, types="fail_deep")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("fail_deep", {"deep": 300}, max_attempts=1)
        [run] = _finished(client, job_id, "dead", 1).attempt_history
        assert run.outcome == "failed"
        assert run.error == "RuntimeError: fail_deep always fails (attempt 1)"
        assert len(run.traceback) <= 1000
        assert run.traceback.startswith("...\n") and "Traceback (most recent call last):" in run.traceback
        assert run.traceback.rstrip().endswith(run.error)
        assert len(client.get_job(job_id).last_error) > 10_000  # the job's own error is not cut to it


def test_history_off_keeps_only_the_latest_run(start_dispatcher, redis_url, db_url, start_worker):
    dispatcher = start_dispatcher(redis_url, db_url, attempt_history=False)
    start_worker(dispatcher.target, types="flaky", worker_id="w-off")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("flaky", {"fail_times": 1})
        [latest] = _finished(client, job_id, "succeeded", 1).attempt_history  # from the job's row
        # Off, nothing of the history is written: not even the worker with the lease's row update.
        assert (latest.attempt, latest.worker_id, latest.outcome) == (2, "", "succeeded")
    assert query(db_url, "SELECT COUNT(*) FROM job_attempts") == [(0,)]


def test_a_run_that_succeeds_writes_no_attempt_row(dispatcher, start_worker, db_url):
    """The common case costs nothing: a job's latest run is in its row (worker, start, end)."""
    start_worker(dispatcher.target, types="noop,flaky", worker_id="w-row")
    with Client(dispatcher.target) as client:
        ok = client.enqueue("noop")
        flaky = client.enqueue("flaky", {"fail_times": 1})
        assert client.get_job(ok).worker_id in ("", "w-row")
        _finished(client, ok, "succeeded", 1)
        _finished(client, flaky, "succeeded", 2)
        assert client.get_job(ok).worker_id == "w-row"
    rows = query(db_url, "SELECT job_id, attempt, outcome FROM job_attempts")
    assert rows == [(flaky, 1, "failed")]


def test_prune_and_purge_delete_a_jobs_attempts_with_it(dispatcher, start_worker, db_url):
    start_worker(dispatcher.target, types="flaky,final")
    with Client(dispatcher.target) as client:
        old, kept = (client.enqueue("flaky", {"fail_times": 1}) for _ in range(2))
        dead = client.enqueue("final")
        _finished(client, old, "succeeded", 2)
        _finished(client, kept, "succeeded", 2)
        _finished(client, dead, "dead", 1)
        query(db_url, "UPDATE jobs SET finished_at = finished_at - 7200000 WHERE id = ?", (old,))
        # A finished row goes once Redis has forgotten its record (after its commit is on disk).
        wait_until(lambda: client.prune_jobs(3600) == (1, False), timeout=10)
        client.purge_dead()
    left = {r[0] for r in query(db_url, "SELECT job_id FROM job_attempts")}
    assert left == {kept}


def test_job_show_prints_the_timeline(dispatcher, start_worker):
    start_worker(dispatcher.target, types="flaky", worker_id="w-show")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("flaky", {"fail_times": 1})
        _finished(client, job_id, "succeeded", 2)
    out = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", "--target", dispatcher.target, "job", "show", job_id],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=True,
    ).stdout
    timeline = out.split("attempts:\n", 1)[1]
    lines = timeline.splitlines()
    assert "outcome" in lines[0] and "worker" in lines[0]
    assert "w-show" in lines[1] and "failed" in lines[1] and "flaky failure on attempt 1" in lines[1]
    assert "succeeded" in lines[2]
    assert "attempt 1 traceback:\nTraceback (most recent call last):" in timeline

"""Recurring jobs end to end: real dispatcher and worker processes, real Redis and DB.

Occurrences are read back three ways: the DB rows (materialized once), the worker's ledger (run
once, on time), and the schedule's counters (materialized / skipped)."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue.failpoints import CRASH_EXIT_CODE
from dispatcher.queue.ids import time_of
from dispatcher.schedules.cron import Cron
from shardmap import shard_for
from tests.e2e.conftest import TEST_SETTINGS
from tests.e2e.test_operations import scrape
from tests.support.db import query
from tests.support.ports import free_port
from tests.support.processes import DispatcherProcess, WorkerProcess, read_ledger
from tests.support.wait import wait_until
from worker_sdk import Client, InvalidArgumentError, NotFoundError, Schedule

SECOND = 1000
MINUTE = 60_000


def occurrences_in_db(db_url: str, name: str) -> list[tuple[str, int, str]]:
    """(id, occurrence time, status) of the jobs the schedule materialized, by occurrence. The time
    is read from the id: a job's run_at moves when a run of it is retried."""
    rows = query(db_url, "SELECT id, status FROM jobs WHERE schedule = ?", (name,))
    return sorted(((r[0], time_of(r[0]), r[1]) for r in rows), key=lambda r: r[1])


def starts(ledger: Path, job_type: str) -> list[dict[str, Any]]:
    return [e for e in read_ledger(ledger) if e["event"] == "start" and e["type"] == job_type]


def every_second(name: str, job_type: str, **fields: Any) -> Schedule:
    return Schedule(name=name, cron="* * * * * *", job_type=job_type, **fields)


@pytest.mark.serial
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_every_second_for_30_s_runs_each_second_once_and_on_time(
    dispatcher: DispatcherProcess, start_worker: Callable[..., WorkerProcess], ledger: Path, db_url: str
) -> None:
    start_worker(dispatcher.target, types="noop.tick")
    with Client(dispatcher.target) as client:
        client.upsert_schedule(every_second("tick", "noop.tick"))
        # Measure 30 whole seconds, starting after the first occurrence ran (the worker is warm).
        wait_until(lambda: starts(ledger, "noop.tick"), timeout=15)
        window_start = (time.time() // 1 + 2) * 1000
        window_end = window_start + 30 * SECOND
        wait_until(
            lambda: any(e["run_at"] * 1000 >= window_end for e in starts(ledger, "noop.tick")), timeout=45
        )
        client.pause_schedule("tick")
    runs = [e for e in starts(ledger, "noop.tick") if window_start <= e["run_at"] * 1000 < window_end]
    seconds = Counter(round(e["run_at"] * 1000) for e in runs)
    assert 29 <= len(seconds) <= 31, sorted(seconds)
    assert max(seconds.values()) == 1, [s for s, n in seconds.items() if n > 1]  # none twice
    lags = sorted(e["t"] - e["run_at"] for e in runs)
    assert lags[0] >= 0, "an occurrence started before its second"
    assert lags[-1] < 0.1, f"start lag p50 {lags[len(lags) // 2] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms"
    in_db = [at for _, at, _ in occurrences_in_db(db_url, "tick") if window_start <= at < window_end]
    assert len(in_db) == len(set(in_db)) == len(seconds)


@pytest.mark.parametrize(
    "failpoint", ["schedule.before-commit", "schedule.after-commit", "schedule.after-push"]
)
@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_crash_mid_materialization_leaves_no_occurrence_missing_or_doubled(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
    failpoint: str,
    tmp_path: Path,
) -> None:
    """The dispatcher exits (like SIGKILL) before the DB commit, between the commit and Redis, or
    right after Redis; the restarted one (same member id: it takes its shards back at once)
    materializes and runs every occurrence exactly once."""
    # The schedule is created while the failpoint is not armed: the crash must come from a tick.
    dispatcher = start_dispatcher(redis_url, db_url, dispatcher_id="d1", schedule_tick_ms=60_000)
    with Client(dispatcher.target) as client:
        client.upsert_schedule(every_second("crashy", "noop.crashy", catch_up="all"))
    dispatcher.stop()
    settings = {**TEST_SETTINGS, "dispatcher_id": "d1", "failpoints": failpoint}
    crashing = DispatcherProcess(redis_url, db_url, tmp_path, **settings).start(wait=False)
    try:
        assert crashing.process is not None
        assert crashing.process.wait(30) == CRASH_EXIT_CODE, crashing.log_tail()
    finally:
        crashing.kill()
    crashed_at = time.time()
    restarted = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    start_worker(restarted.target, types="noop.crashy")
    wait_until(lambda: any(e["run_at"] > crashed_at + 4 for e in starts(ledger, "noop.crashy")), timeout=30)
    with Client(restarted.target) as client:
        client.pause_schedule("crashy")
        wait_until(
            lambda: all(s in ("succeeded", "cancelled") for _, _, s in occurrences_in_db(db_url, "crashy")),
            timeout=20,
        )
    rows = occurrences_in_db(db_url, "crashy")
    ran = [at for _, at, status in rows if status == "succeeded"]
    assert ran, "nothing ran"
    assert len(ran) == len(set(ran)), "an occurrence was materialized twice"
    assert ran == list(range(ran[0], ran[-1] + 1, SECOND)), "an occurrence is missing"
    run_counts = Counter(e["job"] for e in starts(ledger, "noop.crashy"))
    assert max(run_counts.values()) == 1, "an occurrence ran twice"
    assert set(run_counts) == {i for i, _, s in rows if s == "succeeded"}


# PostgreSQL: a process frozen mid-write would hold SQLite's one write lock and stall the takeover.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_dispatchers_racing_for_the_schedules_shard_make_each_occurrence_once(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    """A member SIGSTOPped while owning the schedule's shard loses it to the other; when it is
    continued it still believes, for a moment, that it owns the shard and ticks on. Its stale
    epoch and the cursor compare-and-set keep every occurrence to one job."""
    first = start_dispatcher(redis_url, db_url, ownership_ttl_ms=1500)
    second = start_dispatcher(redis_url, db_url, ownership_ttl_ms=1500)
    start_worker(first.target, types="noop.race")
    start_worker(second.target, types="noop.race")
    with Client(first.target) as client:
        client.upsert_schedule(every_second("race", "noop.race", catch_up="all"))
        wait_until(lambda: starts(ledger, "noop.race"), timeout=15)  # it ticks before the race begins
        for _ in range(2):
            owner_id, epoch = wait_until(lambda: _settled_owner(client, "noop.race"), timeout=20)
            owner, other = (first, second) if owner_id.endswith(f"-{first.port}") else (second, first)
            stale_before = owner.log_tail(100_000).count("shard taken over by another owner")
            owner.signal(signal.SIGSTOP)
            try:
                with Client(other.target) as other_client:
                    wait_until(
                        lambda: _moved(other_client, epoch),  # noqa: B023
                        timeout=30,
                        message="the stopped owner's shard was not taken over",
                    )
            finally:
                owner.signal(signal.SIGCONT)
            # Continued, it ticks on with its stale epoch until a script refuses it.
            wait_until(
                lambda: owner.log_tail(100_000).count("shard taken over by another owner") > stale_before,  # noqa: B023
                timeout=20,
            )

        client.pause_schedule("race")
        wait_until(
            lambda: all(s in ("succeeded", "cancelled") for _, _, s in occurrences_in_db(db_url, "race")),
            timeout=30,
        )
    rows = occurrences_in_db(db_url, "race")
    assert rows, "the schedule made no occurrence at all"
    times = [at for _, at, _ in rows]
    assert len(times) == len(set(times)), "an occurrence was materialized twice"
    assert times == list(range(times[0], times[-1] + 1, SECOND)), "an occurrence is missing"
    run_counts = Counter(e["job"] for e in starts(ledger, "noop.race"))
    assert max(run_counts.values()) == 1, "an occurrence ran twice"


def _moved(client: Client, epoch: int) -> tuple[str, int] | None:
    """The shard's owner and epoch once it has a newer epoch than `epoch`."""
    now = _owner_of(client, "noop.race")
    return now if now is not None and now[1] > epoch else None


def _settled_owner(client: Client, job_type: str) -> tuple[str, int] | None:
    """The shard's owner and epoch once placement is done with it (its owner is the one it should have)."""
    view = client.shard_map()
    shard = shard_for(job_type, view.shard_count)
    info = next(s for s in view.shards if s.shard == shard)
    return (info.owner, info.epoch) if info.owner and info.owner == info.assigned else None


def _owner_of(client: Client, job_type: str) -> tuple[str, int] | None:
    view = client.shard_map()
    shard = shard_for(job_type, view.shard_count)
    return next(((s.owner, s.epoch) for s in view.shards if s.shard == shard and s.owner), None)


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_ten_minutes_of_downtime_is_caught_up_as_each_policy_says(
    start_dispatcher: Callable[..., DispatcherProcess],
    start_worker: Callable[..., WorkerProcess],
    ledger: Path,
    redis_url: str,
    db_url: str,
) -> None:
    """Per-minute schedules with max lag 5 min; the dispatcher is down while 10 minutes pass (the
    schedules' cursors are moved back 10 minutes while it is stopped: the state a real 10-minute
    outage leaves). After the restart: all -> the 5 occurrences within max lag; latest -> the most
    recent one; none -> nothing; every other missed occurrence is counted as skipped."""
    # Keep clear of minute boundaries so "within 5 minutes" is not decided by milliseconds.
    # More than the misfire grace (15 s) after the minute: the latest occurrence counts as missed.
    wait_until(lambda: 20 <= time.time() % 60 <= 40, timeout=60)
    dispatcher = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    policies = ("all", "latest", "none")
    with Client(dispatcher.target) as client:
        for policy in policies:
            client.upsert_schedule(
                Schedule(
                    name=f"m-{policy}",
                    cron="* * * * *",
                    job_type=f"noop.{policy}",
                    max_lag=300,
                    catch_up=policy,
                )
            )
        wait_until(lambda: all(s.next_occurrence_ms for s in client.schedules()), timeout=10)
    dispatcher.stop()
    down_since = int(time.time() * 1000) - 10 * MINUTE
    query(db_url, "UPDATE schedules SET cursor_ms = ?, next_occurrence_ms = ?", (down_since, down_since + 1))
    restarted_at = int(time.time() * 1000)
    restarted = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    start_worker(restarted.target, types=",".join(f"noop.{p}" for p in policies))
    cron = Cron.parse("* * * * *")
    missed = cron.occurrences(down_since, restarted_at, 100)
    assert len(missed) == 10
    expected = {
        "all": [at for at in missed if at >= restarted_at - 5 * MINUTE],
        "latest": [missed[-1]],
        "none": [],
    }
    assert len(expected["all"]) == 5
    with Client(restarted.target) as client:
        wait_until(lambda: all(s.materialized + s.skipped >= 10 for s in client.schedules()), timeout=20)
        for policy in policies:
            want = expected[policy]
            job_type, count = f"noop.{policy}", len(want)
            wait_until(lambda: len(starts(ledger, job_type)) >= count, timeout=20)  # noqa: B023
            info = client.get_schedule(f"m-{policy}")
            ran = sorted(round(e["run_at"] * 1000) for e in starts(ledger, f"noop.{policy}"))
            assert [at for at in ran if at <= restarted_at] == want, policy
            in_db = [at for _, at, _ in occurrences_in_db(db_url, f"m-{policy}")]
            assert [at for at in in_db if at <= restarted_at] == want, policy
            ahead = len([at for at in in_db if at > restarted_at])  # the coming minute, if looked ahead at
            assert info.materialized == len(want) + ahead and info.skipped == 10 - len(want), policy


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_pause_edit_resume_and_delete_take_effect_at_the_next_tick(
    dispatcher: DispatcherProcess, start_worker: Callable[..., WorkerProcess], ledger: Path, db_url: str
) -> None:
    start_worker(dispatcher.target, types="noop.ed")
    with Client(dispatcher.target) as client:
        client.upsert_schedule(every_second("ed", "noop.ed"))
        # The lookahead materializes a few seconds ahead: those are the future occurrences.
        wait_until(lambda: sum(at > time.time() * 1000 for _, at, _ in occurrences_in_db(db_url, "ed")) >= 3)
        paused = client.pause_schedule("ed")
        assert not paused.enabled
        paused_at = time.time()
        wait_until(
            lambda: all(
                s == "cancelled"
                for _, at, s in occurrences_in_db(db_url, "ed")
                if at > paused_at * 1000 + 500
            )
        )
        time.sleep(2.5)  # a paused schedule: nothing may start in this window
        assert not [e for e in starts(ledger, "noop.ed") if e["t"] > paused_at + 1.0]

        resumed = client.resume_schedule("ed")
        assert resumed.enabled and resumed.version == paused.version + 1
        resumed_at = time.time()
        wait_until(lambda: any(e["t"] > resumed_at for e in starts(ledger, "noop.ed")), timeout=10)

        # Edit: every 2 s from now. The old version's future occurrences are cancelled.
        info, changed = client.upsert_schedule(Schedule(name="ed", cron="*/2 * * * * *", job_type="noop.ed"))
        assert changed and info.version == resumed.version + 1
        edited_at = time.time()
        wait_until(lambda: any(e["run_at"] > edited_at + 4 for e in starts(ledger, "noop.ed")), timeout=15)
        after = [round(e["run_at"]) for e in starts(ledger, "noop.ed") if e["run_at"] > edited_at + 1]
        assert after and all(at % 2 == 0 for at in after), after

        client.delete_schedule("ed")
        deleted_at = time.time()
        with pytest.raises(NotFoundError):
            client.get_schedule("ed")
        wait_until(
            lambda: all(
                s in ("cancelled", "succeeded")
                for _, at, s in occurrences_in_db(db_url, "ed")
                if at > deleted_at * 1000 + 500
            )
        )
        wait_until(lambda: not query(db_url, "SELECT name FROM schedules WHERE name = 'ed'"))
        time.sleep(2.5)
        assert not [e for e in starts(ledger, "noop.ed") if e["t"] > deleted_at + 1.0]
    counts = Counter(e["job"] for e in starts(ledger, "noop.ed"))
    assert max(counts.values()) == 1


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_schedule_deleted_and_created_again_under_its_name_misses_no_second(
    dispatcher: DispatcherProcess, start_worker: Callable[..., WorkerProcess], ledger: Path, db_url: str
) -> None:
    """Deleted (its row gone, the occurrences it materialized ahead cancelled), then created again
    1.5 s later under the same name: the new schedule's occurrences fall on the seconds the deleted
    one had cancelled, and each of them is a new job that runs."""
    start_worker(dispatcher.target, types="noop.again")
    with Client(dispatcher.target) as client:
        client.upsert_schedule(every_second("again", "noop.again"))
        wait_until(
            lambda: sum(at > time.time() * 1000 for _, at, _ in occurrences_in_db(db_url, "again")) >= 3
        )
        client.delete_schedule("again")
        deleted_at = time.time()
        wait_until(lambda: not query(db_url, "SELECT name FROM schedules WHERE name = 'again'"))
        time.sleep(max(0.0, deleted_at + 1.5 - time.time()))
        client.upsert_schedule(every_second("again", "noop.again"))
        created_at = time.time()
        cancelled_ahead = [
            at
            for _, at, s in occurrences_in_db(db_url, "again")
            if s == "cancelled" and at > created_at * 1000
        ]
        assert cancelled_ahead, "the deleted schedule had nothing materialized past the new one's start"
        wanted = range(math.ceil(created_at), math.ceil(created_at) + 8)
        wait_until(
            lambda: any(e["run_at"] >= wanted[-1] for e in starts(ledger, "noop.again")),
            timeout=20,
            message=lambda: f"no run at {wanted[-1]}: {dispatcher.log_tail(20)}",
        )
        client.pause_schedule("again")
    runs = Counter(round(e["run_at"]) for e in starts(ledger, "noop.again") if e["run_at"] > created_at - 1)
    missing = [second for second in wanted if second not in runs]
    assert not missing, f"seconds without a run after the schedule was created again: {missing}"
    assert max(runs.values()) == 1, [second for second, n in runs.items() if n > 1]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_upsert_is_idempotent_and_bad_schedules_are_refused_changing_nothing(
    dispatcher: DispatcherProcess, db_url: str
) -> None:
    with Client(dispatcher.target) as client:
        spec = Schedule(name="nightly", cron="30 2 * * *", job_type="noop.n", timezone="Europe/Berlin")
        first, changed = client.upsert_schedule(spec)
        assert changed and first.version == 1
        again, changed = client.upsert_schedule(spec)
        assert not changed and again.version == 1
        before = query(db_url, "SELECT * FROM schedules")
        bad = [
            (dict(cron="61 * * * *"), "schedule.cron: bad cron expression"),
            (dict(cron="* * *"), "has 3 fields"),
            (dict(cron="@sometimes"), "unknown cron alias"),
            (dict(cron="0 0 30 2 *"), "never fires"),
            (dict(timezone="Mars/Olympus"), "schedule.timezone: unknown time zone 'Mars/Olympus'"),
            (dict(max_lag=0), "schedule.max_lag_ms"),
            (dict(max_lag=10**9), "schedule.max_lag_ms"),
            (dict(name=""), "schedule.name: must not be empty"),
            (dict(name="bad name!"), "is not a schedule name"),
            (dict(job_type=""), "schedule.type: must not be empty"),
            (dict(max_attempts=0), "max_attempts"),
        ]
        for change, message in bad:
            fields = {"name": "nightly", "cron": "30 2 * * *", "job_type": "noop.n", **change}
            with pytest.raises(InvalidArgumentError, match=message):
                client.upsert_schedule(Schedule(**fields))
        assert query(db_url, "SELECT * FROM schedules") == before
        with pytest.raises(NotFoundError):
            client.pause_schedule("nope")
        occurrences, zone = client.next_occurrences("nightly", 3)
        assert zone == "Europe/Berlin" and len(occurrences) == 3
        gaps = [b - a for a, b in zip(occurrences, occurrences[1:], strict=False)]
        assert all(23 * 3_600_000 <= gap <= 25 * 3_600_000 for gap in gaps), gaps


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dispatcherctl_schedule_commands(dispatcher: DispatcherProcess) -> None:
    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.ctl", "--target", dispatcher.target, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    added = ctl(
        "schedule",
        "add",
        "hourly",
        "--cron",
        "@hourly",
        "--type",
        "noop.h",
        "--tz",
        "Asia/Kolkata",
        "--max-lag",
        "30m",
        "--catch-up",
        "all",
        "--payload",
        '{"k": 1}',
    )
    assert added.returncode == 0, added.stderr
    assert "schedule hourly saved" in added.stdout
    again = ctl(
        "schedule",
        "add",
        "hourly",
        "--cron",
        "@hourly",
        "--type",
        "noop.h",
        "--tz",
        "Asia/Kolkata",
        "--max-lag",
        "30m",
        "--catch-up",
        "all",
        "--payload",
        '{"k": 1}',
    )
    assert "unchanged" in again.stdout
    listed = ctl("schedule", "list")
    assert "hourly" in listed.stdout and "Asia/Kolkata" in listed.stdout
    nxt = ctl("schedule", "next", "hourly", "--count", "2")
    assert nxt.returncode == 0 and "+05:30" in nxt.stdout and "+00:00" in nxt.stdout
    stats = ctl("stats")
    assert stats.returncode == 0 and "hourly" in stats.stdout and "skipped" in stats.stdout
    assert "paused" in ctl("schedule", "pause", "hourly").stdout
    assert "state            paused" in ctl("schedule", "show", "hourly").stdout
    assert "resumed" in ctl("schedule", "resume", "hourly").stdout
    for args, message in [
        (("schedule", "add", "x", "--cron", "61 * * * *", "--type", "t"), "bad cron expression"),
        (
            ("schedule", "add", "x", "--cron", "* * * * *", "--type", "t", "--tz", "No/Where"),
            "unknown time zone",
        ),
        (
            ("schedule", "add", "x", "--cron", "* * * * *", "--type", "t", "--max-lag", "soon"),
            "not a duration",
        ),
        (("schedule", "add", "x", "--cron", "* * * * *", "--type", "t", "--payload", "{"), "not valid JSON"),
        (("schedule", "show", "nope"), "no schedule nope"),
        (("schedule", "next", "hourly", "--count", "0"), "--count must be in 1..1000"),
    ]:
        result = ctl(*args)
        assert result.returncode != 0 and message in result.stderr, (args, result.stderr)
    assert ctl("schedule", "rm", "hourly").returncode == 0
    assert "no schedules" in ctl("schedule", "list").stdout


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_schedules_declared_in_a_file_are_upserted_at_start(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str, tmp_path: Path
) -> None:
    declared = tmp_path / "schedules.toml"
    declared.write_text(
        '[[schedule]]\nname = "report"\ncron = "0 6 * * 1-5"\ntype = "noop.report"\n'
        'timezone = "America/New_York"\npayload = { format = "pdf" }\nmax_lag = "2h"\ncatch_up = "none"\n'
    )
    first = start_dispatcher(redis_url, db_url, schedules_file=str(declared), dispatcher_id="d1")
    with Client(first.target) as client:
        info = client.get_schedule("report")
        assert (info.cron, info.timezone, info.catch_up, info.max_lag_ms) == (
            "0 6 * * 1-5",
            "America/New_York",
            "none",
            7_200_000,
        )
        assert info.payload == b'{"format":"pdf"}'
    first.stop()
    second = start_dispatcher(redis_url, db_url, schedules_file=str(declared), dispatcher_id="d1")
    with Client(second.target) as client:
        assert client.get_schedule("report").version == 1  # declared again, unchanged: nothing done
    second.stop()
    declared.write_text('[[schedule]]\nname = "report"\ncron = "61 * * * *"\ntype = "noop.report"\n')
    broken = DispatcherProcess(redis_url, db_url, tmp_path, schedules_file=str(declared), shard_count=8)
    with pytest.raises(RuntimeError, match="bad cron expression"):
        broken.start()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_schedule_metrics_count_materialized_and_skipped(
    start_dispatcher: Callable[..., DispatcherProcess], redis_url: str, db_url: str
) -> None:
    first = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    with Client(first.target) as client:
        client.upsert_schedule(every_second("metered", "noop.metered", catch_up="none"))
    first.stop()
    # A minute without any scheduler: 60 occurrences, the last 15 s of them within the misfire grace.
    down_since = int(time.time() * 1000) - 60 * SECOND
    query(db_url, "UPDATE schedules SET cursor_ms = ?, next_occurrence_ms = ?", (down_since, down_since + 1))
    port = free_port()
    start_dispatcher(redis_url, db_url, dispatcher_id="d1", metrics_listen=f"127.0.0.1:{port}")
    wait_until(lambda: scrape(port).get("shardq_schedule_occurrences_skipped_total", 0) >= 40, timeout=20)
    wait_until(
        lambda: scrape(port).get("shardq_schedule_occurrences_materialized_total", 0) >= 15, timeout=20
    )
    skipped = scrape(port)["shardq_schedule_occurrences_skipped_total"]
    assert 40 <= skipped <= 47, skipped  # 60 missed, minus the ~15 s of grace, give or take a tick

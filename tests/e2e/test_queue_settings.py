"""Flow control settings end to end, on real dispatcher processes: set through the client, read back
through the client and dispatcherctl, refused whole when a field is bad, mirrored into the Redis hash
the lease script reads (for the owner's shard), and mirrored again after a FLUSHALL and a restart.

What the lease script does with them (pauses, limits, fair share) is tests/e2e/test_flow_control.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import redis

from dispatcher.queue.flow import QueueSettings as StoredSettings
from dispatcher.queue.flow import Rate
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.states import Priority
from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from tests.support.processes import ROOT
from tests.support.wait import wait_until
from worker_sdk import Client, InvalidArgumentError, QueueSettings, RateLimit

SHARDS = 8  # the e2e dispatchers' shard count
MIRROR_BOUND_S = 5.0  # a pass a second: a FLUSHALL heals well within this


def mirrored(redis_url: str, job_type: str) -> StoredSettings | None:
    """The settings the lease script of the type's shard reads, or None when it finds none."""
    r = redis.Redis.from_url(redis_url)
    try:
        raw = r.hget(ShardKeys(shard_for(job_type, SHARDS)).flow, job_type)
    finally:
        r.close()
    return None if raw is None else StoredSettings.unpack(job_type, raw)


def ctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.ctl", "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_settings_round_trip_through_the_client_and_into_redis(dispatcher, redis_url):
    with Client(dispatcher.target) as client:
        # Declared ahead: the type has no jobs yet.
        info = client.get_queue("mail.send")
        assert info.settings == QueueSettings() and info.updated_at_ms == 0 and not info.paused
        wanted = QueueSettings(
            concurrency=5,
            key_concurrency=2,
            key_concurrency_overrides={"big": 10},
            key_weights={"big": 3},
            rate=RateLimit(100.0, 20),
            key_rate=RateLimit(0.5, 1),
        )
        info = client.set_queue_settings("mail.send", wanted)
        assert info.settings == wanted and info.updated_at_ms > 0
        assert info.shard == shard_for("mail.send", SHARDS)
        assert client.get_queue("mail.send").settings == wanted
        # Mirrored at once, for the lease script of the type's shard.
        assert mirrored(redis_url, "mail.send") == StoredSettings(
            "mail.send",
            concurrency=5,
            key_concurrency=2,
            key_concurrency_overrides={"big": 10},
            key_weights={"big": 3},
            rate=Rate(100.0, 20),
            key_rate=Rate(0.5, 1),
        )

        # By fields: the others keep their values.
        info = client.set_queue_settings("mail.send", concurrency=7, rate=(50, 5))
        assert info.settings.concurrency == 7 and info.settings.rate == RateLimit(50.0, 5)
        assert info.settings.key_concurrency == 2 and info.settings.key_weights == {"big": 3}

        # Pause one class, then all; resume one, then all.
        assert client.pause_queue("mail.send", "low").settings.paused == ("low",)
        info = client.pause_queue("mail.send")
        assert info.paused and set(info.settings.paused) == {"high", "default", "low"}
        assert mirrored(redis_url, "mail.send").paused == frozenset(Priority)  # type: ignore[union-attr]
        assert set(client.resume_queue("mail.send", "high").settings.paused) == {"default", "low"}
        info = client.resume_queue("mail.send")
        assert info.settings.paused == () and not info.paused

        # A paused type with jobs is listed with its figures; one with settings only, too.
        client.enqueue_many([{"type": "report.build", "payload": {"i": i}} for i in range(3)])
        client.pause_queue("report.build")
        listed = {q.job_type: q for q in client.list_queues()}
        assert listed["report.build"].paused and listed["report.build"].ready == 3
        assert listed["mail.send"].settings.concurrency == 7 and listed["mail.send"].ready == 0

        # Back to the defaults: no row, and nothing left for the lease script.
        client.set_queue_settings("mail.send", QueueSettings())
        assert client.get_queue("mail.send").updated_at_ms == 0
        assert mirrored(redis_url, "mail.send") is None


def test_bad_settings_are_refused_whole_and_change_nothing(dispatcher, redis_url):
    with Client(dispatcher.target) as client:
        client.set_queue_settings("noop", concurrency=3, paused=("low",))
        before, before_mirror = client.get_queue("noop"), mirrored(redis_url, "noop")
        # A good field beside a bad one: neither is written.
        for changes, field in (
            ({"concurrency": 9, "key_concurrency": -1}, "settings.key_concurrency"),
            ({"concurrency": 2_000_000}, "settings.concurrency"),
            ({"rate": (0, 1)}, "settings.rate.per_s"),
            ({"rate": (10, 0)}, "settings.rate.burst"),
            ({"key_rate": (float("inf"), 1)}, "settings.key_rate.per_s"),
            ({"key_weights": {"a": 5000}}, "settings.key_weights"),
            ({"key_concurrency_overrides": {"k" * 200: 1}}, "settings.key_concurrency_overrides"),
        ):
            with pytest.raises(InvalidArgumentError) as info:
                client.set_queue_settings("noop", **changes)
            assert field in info.value.details, (changes, info.value.details)
            assert client.get_queue("noop") == before, changes
            assert mirrored(redis_url, "noop") == before_mirror, changes
        with pytest.raises(InvalidArgumentError, match="type"):
            client.pause_queue("bad type")
        with pytest.raises(ValueError, match="priority"):
            client.pause_queue("noop", "urgent")
        with pytest.raises(ValueError, match="unknown setting"):
            client.set_queue_settings("noop", speed=3)


def test_the_mirror_comes_back_after_a_flushall_and_a_restart(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url)
    with Client(proc.target) as client:
        client.pause_queue("noop")
        client.set_queue_settings("other.type", key_concurrency=2)
    assert mirrored(redis_url, "noop") is not None
    r = redis.Redis.from_url(redis_url)
    try:
        r.flushall()
        started = time.monotonic()
        wait_until(lambda: mirrored(redis_url, "noop") is not None, timeout=MIRROR_BOUND_S)
        wait_until(lambda: mirrored(redis_url, "other.type") is not None, timeout=MIRROR_BOUND_S)
        healed_s = time.monotonic() - started
        assert mirrored(redis_url, "noop").paused == frozenset(Priority)  # type: ignore[union-attr]
        # Restarted on an empty Redis: the settings are there before the shards serve.
        proc.kill()
        r.flushall()
        proc.start()
        assert mirrored(redis_url, "noop").paused == frozenset(Priority)  # type: ignore[union-attr]
        assert mirrored(redis_url, "other.type").key_concurrency == 2  # type: ignore[union-attr]
    finally:
        r.close()
    assert healed_s < MIRROR_BOUND_S


def test_a_change_through_one_process_reaches_the_owner(start_dispatcher, redis_url, db_url):
    """Two processes: a change made through the one that does not own the type's shard is in Redis at
    once, and removed settings leave the owner's hash too."""
    first = start_dispatcher(redis_url, db_url)
    second = start_dispatcher(redis_url, db_url)
    with Client(first.target) as client:
        wait_until(lambda: len({s.owner for s in client.shard_map().shards}) == 2, timeout=30)
        for target in (first.target, second.target):
            with Client(target) as through:
                through.pause_queue("noop", "high")
                assert mirrored(redis_url, "noop").paused == frozenset({Priority.HIGH})  # type: ignore[union-attr]
                through.resume_queue("noop")
                wait_until(lambda: mirrored(redis_url, "noop") is None, timeout=MIRROR_BOUND_S)


def test_queues_file_declares_settings_at_start_keeping_what_it_leaves_out(
    start_dispatcher, redis_url, db_url, tmp_path: Path
):
    declared = tmp_path / "queues.toml"
    declared.write_text(
        '[queues."mail.send"]\nconcurrency = 20\nkey_concurrency = 2\nrate = "600/m"\nburst = 10\n'
        '[queues.noop]\npaused = ["low"]\n'
    )
    proc = start_dispatcher(redis_url, db_url, queues_file=str(declared))
    with Client(proc.target) as client:
        info = client.get_queue("mail.send")
        assert (info.settings.concurrency, info.settings.key_concurrency) == (20, 2)
        assert info.settings.rate == RateLimit(10.0, 10)
        assert client.get_queue("noop").settings.paused == ("low",)
        client.pause_queue("mail.send")  # an operator's pause...
    proc.kill()
    proc.start()
    with Client(proc.target) as client:
        info = client.get_queue("mail.send")
        assert info.paused and info.settings.concurrency == 20  # ...survives the file at the restart


def test_a_bad_queues_file_stops_the_start(start_dispatcher, redis_url, db_url, tmp_path: Path):
    declared = tmp_path / "queues.toml"
    declared.write_text("[queues.noop]\nconcurrency = -3\n")
    proc = start_dispatcher(redis_url, db_url, queues_file=str(declared), wait=False)
    assert proc.process is not None
    assert proc.process.wait(timeout=30) != 0
    assert "concurrency" in proc.log_tail(20)


def test_dispatcherctl_queue_commands(dispatcher):
    target = dispatcher.target
    done = ctl(
        target, "queue", "limit", "mail.send", "--concurrency", "5", "--per-key-concurrency", "2",
        "--key-limit", "big=10", "--key-weight", "big=3", "--rate", "100/s", "--burst", "20",
        "--key-rate", "2/s", "--key-burst", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = ctl(target, "--json", "queue", "show", "mail.send")
    assert shown.returncode == 0, shown.stderr
    settings = json.loads(shown.stdout)["settings"]
    assert settings["concurrency"] == 5 and settings["key_concurrency"] == 2
    assert settings["key_concurrency_overrides"] == {"big": 10} and settings["key_weights"] == {"big": 3}
    assert settings["rate"] == {"per_s": 100.0, "burst": 20}
    assert settings["key_rate"] == {"per_s": 2.0, "burst": 4}

    assert ctl(target, "queue", "pause", "mail.send", "--priority", "low").returncode == 0
    listed = ctl(target, "queue", "list")
    assert listed.returncode == 0 and "mail.send" in listed.stdout and "low" in listed.stdout
    stats = ctl(target, "stats")  # the types with settings are shown with the queues
    assert stats.returncode == 0 and "paused: low" in stats.stdout, stats.stdout
    assert ctl(target, "queue", "resume", "mail.send").returncode == 0
    assert ctl(target, "queue", "limit", "mail.send", "--concurrency", "0").returncode == 0

    before = ctl(target, "--json", "queue", "show", "mail.send").stdout
    for args, said in (
        (["queue", "limit", "mail.send", "--concurrency", "-1"], "concurrency"),
        (["queue", "limit", "mail.send", "--rate", "fast"], "rate"),
        (["queue", "limit", "mail.send", "--burst", "5"], "burst"),
        (["queue", "limit", "mail.send", "--key-limit", "big"], "key-limit"),
        (["queue", "limit", "mail.send", "--key-weight", "big=5000"], "key_weights"),
        (["queue", "pause", "mail.send", "--priority", "urgent"], "priority"),
        (["queue", "show", "bad type"], "type"),
    ):
        done = ctl(target, *args)
        assert done.returncode != 0, args
        assert said in done.stderr, (args, done.stderr)
    assert ctl(target, "--json", "queue", "show", "mail.send").stdout == before

    cleared = ctl(target, "queue", "limit", "mail.send", "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(ctl(target, "--json", "queue", "show", "mail.send").stdout)["updated_at_ms"] == 0


def test_a_rate_limited_nack_is_accepted_and_counted(
    start_dispatcher, redis_url, db_url, start_worker, ledger
):
    """The worker's RateLimited reaches the dispatcher as a valid rate-limited nack: the stream goes
    on, the job comes back after its retry_after, and the retry is counted apart in the metrics.
    (Attempts not charged, and hold_siblings, are the retry script's: tests/e2e/test_flow_control.py.)"""
    from tests.support.ports import free_port
    from tests.support.processes import read_ledger
    from tests.support.scrape import metric_total

    metrics_port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{metrics_port}")
    start_worker(proc.target, types="limited_once")
    with Client(proc.target) as client:
        job_id = client.enqueue("limited_once", {"retry_after": 0.5})
        wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=30)
    starts = [e["t"] for e in read_ledger(ledger) if e.get("job") == job_id and e["event"] == "start"]
    assert len(starts) == 2 and starts[1] - starts[0] >= 0.5  # back after its retry_after
    wait_until(lambda: metric_total(metrics_port, "shardq_jobs_rate_limited_total", type="limited_once") == 1)


def test_rate_limited_nacks_reach_the_dispatcher_validated(dispatcher):
    """At the stream: a rate-limited nack with its delay is taken, one without is refused by field."""
    channel = grpc.insecure_channel(dispatcher.target)
    try:
        stub = pb_grpc.WorkerServiceStub(channel)
        ref = pb.LeaseRef(job_id="no-such-job", token="t", shard=0)
        good = pb.Nack(lease=ref, rate_limited=True, hold_siblings=True, retry_delay_ms=1500)
        messages = [
            pb.WorkerMessage(hello=pb.Hello(worker_id="w", job_types=["noop"], concurrency=1)),
            pb.WorkerMessage(nacks=pb.Nacks(nacks=[good])),
        ]
        replies = stub.Connect(iter(messages), timeout=10)
        kinds = []
        for reply in replies:
            kinds.append(reply.WhichOneof("msg"))
            if kinds[-1] == "rejected":
                break
        assert kinds[0] == "welcome" and "rejected" in kinds  # a stale lease: rejected, not refused
    finally:
        channel.close()


def test_metrics_show_pauses_limits_and_running_jobs(start_dispatcher, redis_url, db_url, start_worker):
    from tests.support.ports import free_port
    from tests.support.scrape import metric_total

    port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{port}")
    with Client(proc.target) as client:
        client.set_queue_settings("sleepy", concurrency=3, key_concurrency=1, paused=("low",))
        client.enqueue("sleepy", {"sleep": 30}, concurrency_key="tenant-a")
        start_worker(proc.target, types="sleepy")
        wait_until(lambda: client.get_queue("sleepy").running == 1, timeout=20)
        # The running count per key, as the lease script keeps it (the one job of tenant-a runs).
        r = redis.Redis.from_url(redis_url)
        r.hset(ShardKeys(shard_for("sleepy", SHARDS)).key_running("sleepy"), "tenant-a", 1)
        r.close()
        info = client.get_queue("sleepy")
        assert (info.keys_running, info.keys_at_limit) == (1, 1)

    def shown() -> bool:
        return (
            metric_total(port, "shardq_queue_paused", type="sleepy", priority="low") == 1
            and metric_total(port, "shardq_queue_concurrency_limit", type="sleepy") == 3
            and metric_total(port, "shardq_queue_running", type="sleepy") == 1
            and metric_total(port, "shardq_queue_keys_at_limit", type="sleepy") == 1
        )

    wait_until(shown, timeout=10)
    assert metric_total(port, "shardq_queue_paused", type="sleepy", priority="high") == 0


def test_concurrency_keys_are_kept_through_enqueue_hand_off_and_get_job(start_dispatcher, redis_url, db_url):
    """Jobs alike but for their key get records of their own; a hand-off to the owner keeps them."""
    from dispatcher.queue.records import JobRecord

    first = start_dispatcher(redis_url, db_url)
    second = start_dispatcher(redis_url, db_url)
    with Client(first.target) as client:
        wait_until(lambda: len({s.owner for s in client.shard_map().shards}) == 2, timeout=30)
        ids = []
        for target in (first.target, second.target):  # one of them hands the jobs to the owner
            with Client(target) as through:
                ids += through.enqueue_many(
                    [{"type": "noop.keyed", "payload": {}, "concurrency_key": k} for k in ("a", "b", "")]
                )
                ids.append(through.enqueue("noop.keyed", {}, concurrency_key="tenant/ü 1"))
        wanted = ["a", "b", "", "tenant/ü 1"] * 2
        assert [client.get_job(j).concurrency_key for j in ids] == wanted
        r = redis.Redis.from_url(redis_url)
        try:
            jobs = ShardKeys(shard_for("noop.keyed", SHARDS)).jobs
            wait_until(lambda: all(r.hexists(jobs, j) for j in ids), timeout=10)
            assert [JobRecord.unpack(r.hget(jobs, j)).concurrency_key for j in ids] == wanted  # type: ignore[arg-type]
        finally:
            r.close()

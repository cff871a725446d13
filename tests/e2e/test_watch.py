"""Progress, results and waiting end to end (issue 19): handlers report progress, the WatchJob stream
delivers it and the final state, `Client.wait` returns the result or raises, across dispatcher
processes and a dispatcher restart. Real dispatcher and worker processes, Redis, SQLite and
PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from tests.support.ports import free_port
from tests.support.processes import read_ledger
from tests.support.raw_worker import RawWorker
from tests.support.scrape import metric_total
from tests.support.wait import wait_for, wait_until
from worker_sdk import (
    AsyncClient,
    Client,
    InvalidArgumentError,
    JobCancelledError,
    JobContext,
    JobDeadError,
    NotFoundError,
    ShardqError,
)

ROOT = Path(__file__).resolve().parents[2]


def _started(ledger: Path, job_id: str) -> bool:
    return any(e["event"] == "start" and e["job"] == job_id for e in read_ledger(ledger))


def test_progress_is_coalesced_and_the_watch_gets_it_and_the_final_state(
    start_dispatcher, redis_url, db_url, start_worker
):
    metrics_port = free_port()
    dispatcher = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{metrics_port}")
    start_worker(dispatcher.target, types="progress")
    with Client(dispatcher.target) as client:
        payload = {"steps": 2000, "step_sleep": 0.001, "last": {"done": 2000}, "result": {"rows": 7}}
        job_id = client.enqueue("progress", payload)
        events = list(client.watch(job_id, timeout=30))
        final = events[-1]
        assert final.status == "succeeded" and final.progress == {"done": 2000}
        assert final.result == b'{"rows": 7}'
        fractions = [e.progress for e in events if isinstance(e.progress, float)]
        assert fractions, "no progress was streamed while the job ran"
        assert fractions == sorted(fractions) and all(0 < f <= 1 for f in fractions)
        assert all(e.payload == b"" for e in events)
        assert sum(1 for e in events if e.status == "succeeded") == 1
        job = client.get_job(job_id)
        assert job.progress == {"done": 2000}  # the final report is in the DB
    # 2001 reports: the worker sends the latest four times a second, the DB gets it once a second
    # (and the last one with the final status), however long the job took on this machine.
    seconds = (job.finished_at_ms - job.started_at_ms) / 1000
    reports = metric_total(metrics_port, "shardq_progress_reports_total")
    writes = metric_total(metrics_port, "shardq_progress_writes_total")
    assert 1 <= reports <= seconds / 0.25 + 3, (reports, seconds)
    assert 1 <= writes <= seconds + 3, (writes, seconds)
    assert reports < 200 and writes < 50


def test_wait_returns_the_result_and_raises_on_dead_and_cancelled(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="noop,final,sleep")
    with Client(dispatcher.target) as client:
        ok = client.enqueue("noop", {"result_hex": b'{"answer": 42}'.hex()})
        assert client.wait(ok, timeout=20) == {"answer": 42}
        raw = client.enqueue("noop", {"result_hex": "00ff"})
        assert client.wait(raw, timeout=20) == b"\x00\xff"  # not JSON: the bytes as they are
        assert client.wait(client.enqueue("noop"), timeout=20) is None
        dead = client.enqueue("final")
        with pytest.raises(JobDeadError, match="not_retryable") as caught:
            client.wait(dead, timeout=20)
        assert caught.value.job.status == "dead" and caught.value.job.id == dead
        slow = client.enqueue("sleep", {"sleep": 30})
        wait_until(lambda: _started(ledger, slow), timeout=20)

        def cancel_soon() -> None:
            client.cancel(slow)

        threading.Timer(0.3, cancel_soon).start()
        with pytest.raises(JobCancelledError):
            client.wait(slow, timeout=20)


def test_wait_times_out_cleanly_and_the_job_goes_on(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="sleep")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("sleep", {"sleep": 2})
        with pytest.raises(TimeoutError, match=job_id):
            client.wait(job_id, timeout=0.5)
        assert client.wait(job_id, timeout=20) is None  # the job ran on, and finished


async def test_async_wait_with_progress_callback(dispatcher, start_worker):
    start_worker(dispatcher.target, types="progress")
    async with AsyncClient(dispatcher.target) as client:
        job_id = await client.enqueue("progress", {"steps": 20, "step_sleep": 0.1, "result": [1, 2]})
        seen: list[Any] = []
        assert await client.wait(job_id, timeout=30, on_progress=seen.append) == [1, 2]
        assert seen and seen == sorted(seen) and seen[-1] == 1.0


def test_watch_through_another_process_resumes_across_its_restart(
    start_dispatcher, redis_url, db_url, start_worker
):
    """The client talks to process A; the job's shard is owned by process B. A is stopped while the
    job runs, the job finishes on B meanwhile, A comes back: the wait resumes and reports the finish
    (the DB holds it)."""
    # Ids that rendezvous hashing splits 4/4 over the 8 shards: the default ones (host-port) give
    # one member every shard about once in 500 pairs, and the wait below would never end.
    a = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    b = start_dispatcher(redis_url, db_url, dispatcher_id="d2")
    with Client(b.target) as client:

        def owners() -> dict[int, str]:
            shards = client.shard_map().shards
            return {s.shard: s.address for s in shards} if all(s.owner for s in shards) else {}

        wait_until(lambda: set(owners().values()) == {a.target, b.target}, timeout=30)
        job_type = next(
            t for t in (f"progress_{i}" for i in range(100)) if owners()[shard_for(t, 8)] == b.target
        )
    start_worker(b.target, types=job_type)
    progress: list[Any] = []
    outcome: dict[str, Any] = {}
    with Client(a.target) as client:
        job_id = client.enqueue(job_type, {"steps": 60, "step_sleep": 0.1, "result": "done"})

        def wait() -> None:
            try:
                outcome["result"] = client.wait(job_id, timeout=60, on_progress=progress.append)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_until(lambda: progress, timeout=20, message="no progress reached the client through A")
        a.stop()  # the stream breaks; the job runs on at B and finishes while A is down
        with Client(b.target) as direct:
            wait_until(lambda: direct.get_job(job_id).status == "succeeded", timeout=30)
        a.start()
        waiter.join(30)
    assert outcome == {"result": "done"}
    assert progress == sorted(progress)


async def test_watches_are_bounded_per_process(start_dispatcher, redis_url, db_url):
    dispatcher = start_dispatcher(redis_url, db_url, max_watches=2)
    async with AsyncClient(dispatcher.target) as client:
        ids = [await client.enqueue("nobody_runs_this") for _ in range(3)]
        streams = [client.watch(i, timeout=30) for i in ids[:2]]
        firsts = [await s.__anext__() for s in streams]
        assert [f.status for f in firsts] == ["ready", "ready"]
        with pytest.raises(ShardqError) as refused:
            await client.watch(ids[2], timeout=30).__anext__()
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "SHARDQ_MAX_WATCHES" in refused.value.details
        for s in streams:
            await s.aclose()
        # the slots are free again once the streams end
        await wait_for(lambda: _watch_opens(client, ids[2]), timeout=10)


async def _watch_opens(client: AsyncClient, job_id: str) -> bool:
    stream = client.watch(job_id, timeout=5)
    try:
        await stream.__anext__()
        return True
    except ShardqError:
        return False
    finally:
        await stream.aclose()


def test_bad_input_is_refused_naming_the_field(dispatcher):
    with Client(dispatcher.target) as client:
        for bad in ("", "x" * 1000, "caf\u00e9"):
            with pytest.raises(InvalidArgumentError, match="job_id"):
                client.wait(bad, timeout=5)
        with pytest.raises(NotFoundError):
            client.wait("01" + "A" * 24, timeout=5)
    ctx = JobContext("j", "t", b"", 1, 1, "default", 0, "", 0, "tok", 0)
    for bad in (1.5, -0.1, float("nan"), True, "half", {"blob": "x" * 5000}, {"x": object()}):
        with pytest.raises(ValueError, match="progress"):
            ctx.progress(bad)  # type: ignore[arg-type]
    ctx.progress(0.5)  # no worker attached: nothing to send, no error
    ctx.progress({"done": 1})


async def test_a_bad_progress_report_closes_the_stream_naming_the_field(dispatcher):
    worker = RawWorker(dispatcher.target)
    try:
        await worker.hello("w-bad-progress", ["noop"])
        ref = pb.LeaseRef(job_id="01" + "A" * 24, token="t", shard=0)
        report = pb.JobProgress(lease=ref, progress="2.5")
        await worker.send(progress=pb.ProgressReports(reports=[report]))
        assert await worker.call.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "progress.reports[0].progress" in await worker.call.details()
    finally:
        await worker.channel.close()


def test_ctl_job_watch_prints_progress_live_then_the_outcome(dispatcher, start_worker):
    start_worker(dispatcher.target, types="progress")
    with Client(dispatcher.target) as client:
        job_id = client.enqueue("progress", {"steps": 20, "step_sleep": 0.1, "result": "ok"})
    command = [sys.executable, "-m", "dispatcher.cli.ctl", "--target", dispatcher.target]
    command += ["job", "watch", job_id]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) as watcher:
        assert watcher.stdout is not None
        first = watcher.stdout.readline()  # printed while the job runs, before the command exits
        assert watcher.poll() is None and job_id not in first and "attempt" in first
        rest = watcher.stdout.read()
        assert watcher.wait(30) == 0
    lines = [first, *rest.splitlines()]
    assert any("progress 0." in line for line in lines), lines
    assert lines[-1] == f'{job_id} succeeded; result: "ok"'

"""Single enqueues on EnqueueStream, against real dispatcher processes: answers, refusals that leave
the stream open, many threads on one stream, the client's deadline, a dispatcher that stops (every
job read is answered, the rest sent again) or dies, and a dispatcher without the method."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from tests.support.db import query
from tests.support.ports import free_port
from tests.support.scrape import metric_total
from tests.support.wait import wait_until
from worker_sdk import AsyncClient, Client, InvalidArgumentError, UnavailableError
from worker_sdk._errors import ShardqError

on_sqlite = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _rows(db_url: str) -> dict[int, str]:
    """seq (from the payload) -> job id, of every job committed."""
    rows = query(db_url, "SELECT id, payload FROM jobs")
    return {json.loads(payload)["seq"]: job_id for job_id, payload in rows}


@on_sqlite
def test_jobs_and_refusals_share_one_stream(start_dispatcher, redis_url, db_url):
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{port}")
    with Client(proc.target) as client:
        first = client.enqueue("email.send", {"seq": 1})
        with pytest.raises(InvalidArgumentError, match="job.type"):
            client.enqueue("", {"seq": 2})
        with pytest.raises(InvalidArgumentError, match="job.max_attempts"):
            client.enqueue("email.send", {"seq": 3}, max_attempts=100_000)
        second = client.enqueue("email.send", {"seq": 4}, idempotency_key="k")
        assert client.enqueue("email.send", {"seq": 5}, idempotency_key="k") == second
        # One stream carried them all: a refusal does not end it.
        assert metric_total(port, "shardq_enqueue_streams") == 1
    assert _rows(db_url) == {1: first, 4: second}
    wait_until(lambda: metric_total(port, "shardq_enqueue_streams") == 0, 10, message="stream not closed")


@on_sqlite
async def test_async_client_shares_one_stream(start_dispatcher, redis_url, db_url):
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{port}")
    async with AsyncClient(proc.target) as client:
        ids = [await client.enqueue("email.send", {"seq": i}) for i in range(20)]
        with pytest.raises(InvalidArgumentError, match="job.type"):
            await client.enqueue("", {"seq": 99})
        ids.append(await client.enqueue("email.send", {"seq": 20}))
        assert metric_total(port, "shardq_enqueue_streams") == 1
    assert _rows(db_url) == dict(enumerate(ids))


@on_sqlite
def test_threads_share_a_clients_stream(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url)
    got: dict[int, str] = {}
    with Client(proc.target) as client:

        def produce(first: int) -> None:
            for seq in range(first, first + 150):
                got[seq] = client.enqueue(f"type{seq % 5}", {"seq": seq})

        threads = [threading.Thread(target=produce, args=(i * 1000,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(got) == 900
    assert _rows(db_url) == got  # each thread got its own job's id


@on_sqlite
def test_more_jobs_in_flight_than_the_stream_reads_at_once(dispatcher, db_url):
    """The dispatcher reads at most 256 jobs of a stream ahead of their answers; 1,000 written
    without waiting are all answered, each with its own seq, the refused one with the field."""
    with grpc.insecure_channel(dispatcher.target) as channel:
        requests = [
            pb.EnqueueStreamRequest(seq=seq, job=pb.JobSpec(type="" if seq == 500 else "bulk", payload=b"{}"))
            for seq in range(1, 1001)
        ]
        answers = list(pb_grpc.JobServiceStub(channel).EnqueueStream(iter(requests), timeout=60))
    assert sorted(a.seq for a in answers) == list(range(1, 1001))
    [refused] = [a for a in answers if a.error_code]
    assert (refused.seq, refused.error_code, refused.error_message) == (
        500,
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "job.type: must not be empty",
    )
    committed = {a.job_id for a in answers if not a.error_code}
    assert {job_id for (job_id,) in query(db_url, "SELECT id FROM jobs")} == committed


@on_sqlite
def test_a_job_past_the_timeout_fails_and_the_stream_goes_on(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url)
    with Client(proc.target, timeout=1.0) as client:
        client.enqueue("email.send", {"seq": 1})
        proc.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(ShardqError) as caught:
                client.enqueue("email.send", {"seq": 2})
            assert caught.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert 0.9 < time.monotonic() - t0 < 5
        finally:
            proc.signal(signal.SIGCONT)
        third = client.enqueue("email.send", {"seq": 3})
    # The job that timed out was read and committed once the process ran again.
    wait_until(lambda: len(_rows(db_url)) == 3, 10, message="the timed-out job was not committed")
    assert _rows(db_url)[3] == third


@on_sqlite
def test_a_stopping_dispatcher_answers_what_it_read(start_dispatcher, redis_url, db_url):
    """SIGTERM while threads enqueue: every job committed is one whose caller got its id, and every
    call that was refused as not accepted left nothing behind."""
    proc = start_dispatcher(redis_url, db_url)
    got: dict[int, str] = {}
    refused: dict[int, ShardqError] = {}
    stop = threading.Event()
    with Client(proc.target, timeout=10) as client:

        def produce(first: int) -> None:
            seq = first
            while not stop.is_set():
                try:
                    got[seq] = client.enqueue("email.send", {"seq": seq})
                except ShardqError as exc:
                    refused[seq] = exc
                    return
                seq += 1

        threads = [threading.Thread(target=produce, args=(i * 100_000,)) for i in range(16)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(got) >= 200, 30, message="no enqueues went through")
        assert proc.stop() == 0
        for thread in threads:
            thread.join(30)
        stop.set()
    assert len(refused) == 16, refused  # each thread's last call, once nothing listens
    for exc in refused.values():
        # UNAVAILABLE: refused as not accepted, or no connection. CANCELLED: a stream opened while
        # the server was shutting down, which gRPC cancels before any handler reads it.
        assert exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), exc
    assert _rows(db_url) == got


@on_sqlite
def test_a_dead_dispatcher_fails_the_calls_and_a_new_stream_follows(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url)
    with Client(proc.target, timeout=5) as client:
        client.enqueue("email.send", {"seq": 1})
        proc.kill()
        with pytest.raises(UnavailableError):
            client.enqueue("email.send", {"seq": 2})
        proc.start()
        # As for unary calls, the channel may still be backing off from the dead process for a
        # moment: calls fail at once with UNAVAILABLE until it connects.
        last = wait_until(lambda: _enqueued(client, {"seq": 3}), 15, interval=0.1, message="no new stream")
    assert _rows(db_url)[3] == last


def _enqueued(client: Client, payload: dict[str, int]) -> str | None:
    try:
        return client.enqueue("email.send", payload)
    except UnavailableError:
        return None


class _OlderDispatcher(pb_grpc.JobServiceServicer):
    """A JobService from before EnqueueStream: unary Enqueue only (the generated base class answers
    UNIMPLEMENTED for the rest, as an older dispatcher does)."""

    def __init__(self) -> None:
        self.enqueued: list[str] = []

    async def Enqueue(self, request: pb.EnqueueRequest, context: object) -> pb.EnqueueResponse:
        self.enqueued.append(request.job.type)
        return pb.EnqueueResponse(job_id=f"job-{len(self.enqueued)}", created=True)


@contextlib.asynccontextmanager
async def _older_dispatcher() -> AsyncIterator[tuple[str, _OlderDispatcher]]:
    server = grpc.aio.server()
    servicer = _OlderDispatcher()
    pb_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


async def test_a_dispatcher_without_the_stream_gets_unary_calls():
    async with _older_dispatcher() as (target, servicer):
        async with AsyncClient(target) as client:
            assert [await client.enqueue("a", {}), await client.enqueue("b", {})] == ["job-1", "job-2"]

        def blocking() -> list[str]:
            with Client(target) as client:
                return [client.enqueue("c", {}), client.enqueue("d", {})]

        assert await asyncio.to_thread(blocking) == ["job-3", "job-4"]
        assert servicer.enqueued == ["a", "b", "c", "d"]

"""Workers that misbehave on the stream: one that stops reading it, and 1,000 that connect and idle;
and one whose handlers hang in their threads past their timeout.

Neither may block other workers or grow the dispatcher's memory without bound. RSS is the
dispatcher process's own (psutil), measured around the misbehaviour.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import psutil
import pytest

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from tests.support.processes import events, read_ledger
from tests.support.raw_worker import RawWorker
from tests.support.snapshots import redis_digest
from tests.support.wait import wait_for
from worker_sdk import AsyncClient, Client

MiB = 1 << 20


def rss(proc) -> int:
    return int(psutil.Process(proc.process.pid).memory_info().rss)


async def all_succeeded(client: AsyncClient, ids: list[str]) -> bool:
    jobs = [await client.get_job(i) for i in ids]
    return all(j.status == "succeeded" for j in jobs)


async def test_worker_that_stops_reading_blocks_nobody_and_costs_bounded_memory(
    start_dispatcher, redis_url, tmp_path, start_worker
):
    proc = start_dispatcher(redis_url, f"sqlite:///{tmp_path}/shardq.sqlite3")
    client = AsyncClient(proc.target, timeout=30)
    channel = grpc.aio.insecure_channel(proc.target)
    call = pb_grpc.WorkerServiceStub(channel).Connect()
    try:
        # The stuck worker: hello, credit for 10, reads its welcome and first leases, then never reads again.
        first = await client.enqueue_many(
            [{"type": "bp_job", "payload": {"i": i}, "lease_ttl": 3} for i in range(10)]
        )
        await call.write(
            pb.WorkerMessage(hello=pb.Hello(worker_id="stuck", job_types=["bp_job"], concurrency=10))
        )
        assert (await call.read()).WhichOneof("msg") == "welcome"
        await call.write(pb.WorkerMessage(credit=pb.Credit(slots=10)))
        held: list[pb.LeaseRef] = []
        while len(held) < 10:
            message = await asyncio.wait_for(call.read(), 10)
            held += [lease.ref for lease in message.leases.leases]
        # One of its jobs is cancelled: a Cancel message is queued for a stream nobody reads.
        assert await client.cancel(first[0]) == "leased"
        await asyncio.sleep(0.5)
        before = rss(proc)

        # It floods heartbeats: its real leases (each answered by LeasesExtended) and made-up ones
        # (LeasesRejected), about 20 KB of answers per message. A dispatcher that read them all and
        # queued every answer for a stream that is never read would grow by hundreds of MB.
        fake = [pb.LeaseRef(job_id=f"no-such-job-{i:05d}", token=f"1:{i}", shard=0) for i in range(200)]
        heartbeat = pb.WorkerMessage(heartbeat=pb.Heartbeat(leases=held + fake))
        sent = 0

        async def flood() -> None:
            nonlocal sent
            while sent < 20_000:
                await call.write(heartbeat)
                sent += 1

        flooder = asyncio.create_task(flood())
        # Meanwhile a normal worker drains a few hundred jobs.
        start_worker(proc.target, types="bp_job", concurrency=16)
        started = time.monotonic()
        ids = await client.enqueue_many([{"type": "bp_job", "payload": {"n": n}} for n in range(300)])
        await wait_for(
            lambda: all_succeeded(client, ids),
            timeout=30,
            interval=0.2,
            message="the normal worker's jobs did not finish while a stream was stuck",
        )
        drained = time.monotonic() - started
        await asyncio.wait({flooder}, timeout=8)
        after = rss(proc)
        flooder.cancel()
        growth = (after - before) / MiB
        print(
            f"stuck stream: {sent} heartbeats written, RSS {before / MiB:.0f} -> {after / MiB:.0f} MiB "
            f"({growth:+.1f}); 300 jobs drained by another worker in {drained:.1f} s"
        )
        assert growth < 64, f"the dispatcher grew by {growth:.0f} MiB behind a stream nobody reads"
        # "Alive" means listening on the stream: heartbeats sent by a worker that does not read its
        # stream stop counting once its answers back up, so its leases lapse and run elsewhere.
        await wait_for(
            lambda: all_succeeded(client, first[1:]),
            timeout=30,
            interval=0.2,
            message="the stuck worker's leases were kept alive by heartbeats it never read the answers to",
        )
        assert proc.ready()
    finally:
        call.cancel()
        await channel.close()
        await client.close()


IDLE_STREAMS = 1000
STREAMS_PER_CHANNEL = 100


async def test_a_thousand_idle_worker_streams_leave_the_dispatcher_serving(
    start_dispatcher, redis_url, tmp_path, start_worker
):
    proc = start_dispatcher(redis_url, f"sqlite:///{tmp_path}/shardq.sqlite3")
    client = AsyncClient(proc.target, timeout=30)
    # Separate connections (a local subchannel pool each), 100 streams on each.
    channels = [
        grpc.aio.insecure_channel(proc.target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(IDLE_STREAMS // STREAMS_PER_CHANNEL)
    ]
    calls = []
    try:
        await client.enqueue("noop_warmup")
        base = rss(proc)

        async def connect(i: int) -> None:
            call = pb_grpc.WorkerServiceStub(channels[i % len(channels)]).Connect()
            calls.append(call)
            # The same job type as the real worker, and no credit: idle, but woken by every enqueue.
            await call.write(
                pb.WorkerMessage(
                    hello=pb.Hello(worker_id=f"idle-{i}", job_types=["noop_busy"], concurrency=4)
                )
            )
            assert (await asyncio.wait_for(call.read(), 20)).WhichOneof("msg") == "welcome"

        started = time.monotonic()
        await asyncio.gather(*(connect(i) for i in range(IDLE_STREAMS)))
        opened = time.monotonic() - started
        idle = rss(proc)

        start_worker(proc.target, types="noop_busy", concurrency=16)
        latencies = []
        ids = []
        for n in range(100):
            t0 = time.monotonic()
            ids.append(await client.enqueue("noop_busy", {"n": n}))
            latencies.append(time.monotonic() - t0)
        await wait_for(
            lambda: all_succeeded(client, ids),
            timeout=30,
            interval=0.2,
            message="the real worker's jobs did not finish beside 1,000 idle streams",
        )
        latencies.sort()
        p50, worst = latencies[len(latencies) // 2], latencies[-1]
        per_stream_kib = (idle - base) / IDLE_STREAMS / 1024
        print(
            f"{IDLE_STREAMS} idle streams opened in {opened:.1f} s; RSS {base / MiB:.0f} -> "
            f"{idle / MiB:.0f} MiB ({per_stream_kib:.0f} KiB per stream); enqueue beside them: "
            f"p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms"
        )
        assert not any(c.done() for c in calls), "the dispatcher dropped idle streams"
        assert worst < 2.0, f"an enqueue took {worst:.2f} s beside 1,000 idle streams"
        assert per_stream_kib < 256, f"{per_stream_kib:.0f} KiB of dispatcher memory per idle stream"
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
        await client.close()


async def test_acks_with_tokens_a_worker_never_got_finish_nothing(
    start_dispatcher, redis_url, tmp_path, start_worker, ledger
):
    """A worker acks, nacks and heartbeats a job another worker is running, with tokens it never got:
    garbage, and every token the lease scheme could plausibly have issued (the shard's epoch is public,
    the rest a counter). None may finish, fail or extend the job; its real holder completes it."""
    proc = start_dispatcher(redis_url, f"sqlite:///{tmp_path}/shardq.sqlite3")
    client = AsyncClient(proc.target, timeout=30)
    forger = RawWorker(proc.target)
    try:
        start_worker(proc.target, types="sleep_forge", concurrency=2)
        victim = await client.enqueue("sleep_forge", {"sleep": 3})
        await wait_for(lambda: [e for e in read_ledger(ledger) if e["job"] == victim], timeout=15)
        job = await client.get_job(victim)
        assert job.status == "leased"
        with Client(proc.target) as sync_client:  # the map is public: any worker can read the epoch
            epoch = next(s.epoch for s in sync_client.shard_map().shards if s.shard == job.shard)
        before = redis_digest(redis_url)

        guesses = [f"{epoch}:{n}" for n in range(1, 2001)] + [
            f"{e}:{n}" for e in range(1, epoch) for n in range(1, 50)
        ]
        guesses += ["x", "0:0", f"{epoch}:", ":" * 64, "9" * 64]
        refs = [pb.LeaseRef(job_id=victim, token=t, shard=job.shard) for t in guesses]
        await forger.hello("forger", ["noop_forge"], concurrency=1)
        await forger.send(acks=pb.Acks(acks=[pb.Ack(lease=r, result=b"forged") for r in refs]))
        await forger.send(
            nacks=pb.Nacks(nacks=[pb.Nack(lease=r, error="forged", retryable=False) for r in refs])
        )
        await forger.send(heartbeat=pb.Heartbeat(leases=refs))
        rejected: list[str] = []
        while len(rejected) < 3 * len(refs):
            try:
                message = await forger.read(timeout=10)
            except TimeoutError:
                job = await client.get_job(victim)
                raise AssertionError(
                    f"{len(rejected)} of {3 * len(refs)} forged refs rejected; the job "
                    f"is {job.status} (result {job.result!r})"
                ) from None
            kind = message.WhichOneof("msg")
            assert kind == "rejected", f"a forged token was accepted: {message}"
            rejected += [r.ref.token for r in message.rejected.leases]
        assert sorted(rejected) == sorted(guesses * 3)

        after = redis_digest(redis_url)
        assert after.changed(before) == [], "forged acks changed Redis"
        job = await client.get_job(victim)
        assert (job.status, job.failures, job.result) == ("leased", 0, b"")

        # The real holder finishes it, once, and its ack counts.
        async def done() -> bool:
            return (await client.get_job(victim)).status == "succeeded"

        await wait_for(done, timeout=15, interval=0.1)
        job = await client.get_job(victim)
        assert (job.attempts, job.failures, job.expirations, job.result) == (1, 0, 0, b"")
        assert [e["event"] for e in read_ledger(ledger) if e["job"] == victim] == ["start", "end"]
        queues = [q for q in await client.stats() if q.type == "sleep_forge"]
        assert all((q.ready, q.leased, q.delayed, q.dead) == (0, 0, 0, 0) for q in queues), queues
    finally:
        await forger.close()
        await client.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_worker_whose_threads_all_hang_takes_no_jobs_and_says_so(dispatcher, start_worker, tmp_path):
    """Both threads of a concurrency-2 worker hang in sync handlers past their 1 s timeout. It must
    log it and take no more leases: the sync jobs enqueued meanwhile wait, uncharged, for a worker
    that can run them, and run there once each."""
    job_timeout = 1.0
    hung_ledger = tmp_path / "hung.jsonl"
    hung = start_worker(
        dispatcher.target, ledger=hung_ledger, types="block,sync", concurrency=2, job_timeout=job_timeout
    )
    client = AsyncClient(dispatcher.target)
    try:
        blocked = await client.enqueue_many([{"type": "block", "max_attempts": 1}] * 2)
        await wait_for(lambda: len(list(events(hung_ledger, "start"))) == 2, timeout=30)
        ids = await client.enqueue_many([{"type": "sync", "payload": {"i": i}} for i in range(10)])
        for job_id in blocked:
            await wait_for(lambda job_id=job_id: _status_is(client, job_id, "dead"), timeout=15)

        # Long enough for a job queued behind the hung threads to time out in the queue.
        window = time.monotonic() + 3 * job_timeout
        while time.monotonic() < window:
            charged = [j for j in [await client.get_job(i) for i in ids] if j.attempts]
            assert not charged, (
                "a worker with every thread hung took a job: "
                f"{[(j.status, j.attempts, j.failures, j.last_error[-40:]) for j in charged]}"
            )
            await asyncio.sleep(0.1)
        await wait_for(lambda: "every handler thread is stuck" in hung.log_path.read_text(), timeout=10)

        healthy_ledger = tmp_path / "healthy.jsonl"
        start_worker(dispatcher.target, ledger=healthy_ledger, types="sync", concurrency=4)
        await wait_for(lambda: all_succeeded(client, ids), timeout=30)
        jobs = [await client.get_job(i) for i in ids]
        assert [(j.attempts, j.failures) for j in jobs] == [(1, 0)] * 10
        assert sorted(e["job"] for e in events(healthy_ledger, "end")) == sorted(ids)
        assert [e["type"] for e in events(hung_ledger, "start")] == ["block", "block"]
    finally:
        await client.close()


async def _status_is(client: AsyncClient, job_id: str, status: str) -> bool:
    return (await client.get_job(job_id)).status == status

"""The scenario steps every Python driver shares; each system supplies an :class:`Adapter`.

    python -m bench.peers.<system> ACTION 'PARAMS_JSON'

prints ``BENCH-RESULT {json}`` as its last line. Actions: ``versions``, ``ingest``, ``fill``,
``drain``, ``lease``, ``latency``, ``delay``. Start times are not measured here: worker handlers
record them (``_probe``) and the harness reads them from Redis; the driver only enqueues, starts and
stops workers, and reports when each phase began and ended and which job numbers it used.

Every action's parameters may name the ``work`` the handlers do (``_work``; default ``noop``) and the
workers' ``concurrency`` (default: the system's pinned concurrency for that work); the answer says
which were used.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import redis

from ._probe import REDIS_URL_ENV, STARTS_KEY
from ._work import CONCURRENCY_ENV, COUNT_KEY, KINDS, WORK_ENV

RESULT_PREFIX = "BENCH-RESULT "
WARM_UP_JOBS = 4
MAX_IN_FLIGHT = 64
#: how long the last jobs' Redis work may take to land after they started
WORK_SETTLE_S = 30.0


class InFlight:
    """Calls issued without waiting for the ones before them, at most MAX_IN_FLIGHT at a time.

    With a blocking client the calls still run one after another (each blocks the loop while it
    runs); those clients answer in well under a millisecond, so the schedule still holds."""

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.tasks: set[asyncio.Task[None]] = set()
        self.failed = 0

    async def issue(self, call: Callable[[], Awaitable[None]], jobs: int) -> None:
        await self.slots.acquire()
        task = asyncio.create_task(self._run(call, jobs))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, call: Callable[[], Awaitable[None]], jobs: int) -> None:
        try:
            await call()
        except Exception:
            self.failed += jobs
        finally:
            self.slots.release()

    async def wait(self) -> None:
        await asyncio.gather(*self.tasks)


class Job(NamedTuple):
    seq: int
    t_enqueued: float
    run_at: float  # 0: run now


class Adapter:
    """One system's client side. Subclasses enqueue; ``worker_commands`` says how its workers start."""

    #: distributions whose versions are reported
    packages: tuple[str, ...] = ()
    #: how the system is configured for the benchmark, reported with the results
    settings: dict[str, Any] = {}
    #: the workers' concurrency per kind of work: each the fastest a sweep found (``python -m bench
    #: sweep``); ``concurrency_means`` says what the number counts for this system
    concurrency: dict[str, int] = {}
    concurrency_means = "jobs each worker process runs at once"
    #: the concurrency the workers of this action run at (set before any worker starts)
    worker_concurrency = 0

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def enqueue(self, job: Job) -> None:
        """One job, one call (run_at > 0: due then)."""
        raise NotImplementedError

    async def enqueue_batch(self, jobs: list[Job]) -> None:
        """The system's fastest way to add many jobs (run_at > 0: due then)."""
        raise NotImplementedError

    def worker_commands(self, processes: int) -> list[list[str]]:
        """argv lists whose processes together make ``processes`` worker processes, running
        ``worker_concurrency`` jobs as ``concurrency_means`` says."""
        raise NotImplementedError

    def described_settings(self) -> dict[str, Any]:
        return {**self.settings, "worker_concurrency": self.concurrency,
                "worker_concurrency_means": self.concurrency_means}  # fmt: skip


class Workers:
    """Worker processes in their own process groups, so children (prefork pools) stop with them."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.procs = [
            subprocess.Popen(argv, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True)
            for argv in commands
        ]

    def stop(self) -> None:
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class Driver:
    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.redis = redis.Redis.from_url(os.environ[REDIS_URL_ENV])
        self.records_read = 0
        self.started: set[bytes] = set()

    def starts(self) -> int:
        """Jobs started so far, each counted once (a job delivered twice is recorded twice)."""
        fresh = self.redis.lrange(STARTS_KEY, self.records_read, -1)
        self.records_read += len(fresh)
        self.started.update(record.split(b" ", 1)[0] for record in fresh)
        return len(self.started)

    async def wait_starts(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.starts() < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def settle_work(self) -> None:
        """With ``redis`` work, wait (briefly) until every started job's round trip landed, so the
        workers are not stopped under the last ones and the harness can count them."""
        if os.environ.get(WORK_ENV) != "redis":
            return
        deadline = time.monotonic() + WORK_SETTLE_S
        while int(self.redis.get(COUNT_KEY) or 0) < self.starts():
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    async def enqueue_batches(self, first_seq: int, jobs: int, batch: int) -> None:
        for start in range(first_seq, first_seq + jobs, batch):
            now = time.time()
            stop = min(first_seq + jobs, start + batch)
            await self.adapter.enqueue_batch([Job(seq, now, 0.0) for seq in range(start, stop)])

    async def start_workers(self, processes: int, timeout: float = 60, warm_up: bool = True) -> Workers:
        """Start the workers and return once they run jobs (warm-up jobs, numbered below zero).

        Without ``warm_up`` it returns at once: jobs already queued would run before warm-up jobs."""
        workers = Workers(self.adapter.worker_commands(processes))
        if not warm_up:
            return workers
        base = self.starts()
        for seq in range(-WARM_UP_JOBS, 0):
            await self.adapter.enqueue(Job(seq, time.time(), 0.0))
        if not await self.wait_starts(base + WARM_UP_JOBS, timeout):
            workers.stop()
            raise RuntimeError("the workers did not start the warm-up jobs")
        return workers

    # -- actions ---------------------------------------------------------------------------

    async def versions(self, params: dict[str, Any]) -> dict[str, Any]:
        found = {}
        for name in self.adapter.packages:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
        return {"versions": found, "settings": self.adapter.described_settings(),
                "python": sys.version.split()[0]}  # fmt: skip

    async def ingest(self, params: dict[str, Any]) -> dict[str, Any]:
        """Enqueue ``jobs``, or as many as fit in ``max_seconds``: a slow system is measured on fewer.

        Modes: ``one`` (each call awaited before the next), ``pipelined`` (one job per call, up to
        MAX_IN_FLIGHT calls outstanding: what a client with concurrent producers sees) and ``bulk``."""
        jobs, batch = params["jobs"], params["batch"] if params["mode"] == "bulk" else 1
        t0 = time.perf_counter()
        stop_at = t0 + params["max_seconds"]
        done = 0
        if params["mode"] == "pipelined":
            calls = InFlight()
            while done < jobs and time.perf_counter() < stop_at:
                await calls.issue(lambda seq=done: self.adapter.enqueue(Job(seq, time.time(), 0.0)), 1)
                done += 1
            await calls.wait()
            return {"jobs": done - calls.failed, "seconds": time.perf_counter() - t0}
        while done < jobs and time.perf_counter() < stop_at:
            now = time.time()
            if batch == 1:
                await self.adapter.enqueue(Job(done, now, 0.0))
                done += 1
            else:
                count = min(batch, jobs - done)
                await self.adapter.enqueue_batch([Job(seq, now, 0.0) for seq in range(done, done + count)])
                done += count
        return {"jobs": done, "seconds": time.perf_counter() - t0}

    async def fill(self, params: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        await self.enqueue_batches(params.get("first_seq", 0), params["jobs"], params["batch"])
        return {"jobs": params["jobs"], "seconds": time.perf_counter() - t0}

    async def drain(self, params: dict[str, Any]) -> dict[str, Any]:
        """Pre-queue ``jobs`` (unless ``prequeued``), then let the workers run them; with
        ``max_seconds``, stop that long after the first start (``capped``: a slow system is measured
        on the jobs it started by then)."""
        t0 = time.perf_counter()
        if not params.get("prequeued"):
            await self.enqueue_batches(0, params["jobs"], params["batch"])
        prequeue_s = time.perf_counter() - t0
        base = self.starts()
        workers = await self.start_workers(params["processes"], warm_up=False)
        capped = False
        try:
            if "max_seconds" in params:
                begun = await self.wait_starts(base + 1, params["timeout"])
                done = begun and await self.wait_starts(base + params["jobs"], params["max_seconds"])
                capped = begun and not done
            else:
                done = await self.wait_starts(base + params["jobs"], params["timeout"])
            await self.settle_work()
        finally:
            workers.stop()
        return {"jobs": params["jobs"], "prequeue_seconds": prequeue_s, "complete": done, "capped": capped}

    async def latency(self, params: dict[str, Any]) -> dict[str, Any]:
        base = self.starts() + WARM_UP_JOBS
        workers = await self.start_workers(params["processes"])
        try:
            steady = await self._steady(0, params["steady_rate"], params["steady_seconds"])
            burst = await self._burst(
                steady["seq_end"], params["burst_rate"], params["burst_seconds"], params["burst_batch"]
            )
            accepted = steady["sent"] - steady["failed"] + burst["sent"] - burst["failed"]
            done = await self.wait_starts(base + accepted, params["backlog_timeout"])
        finally:
            workers.stop()
        return {"steady": steady, "burst": burst, "complete": done}

    async def _steady(self, first_seq: int, rate: float, seconds: float) -> dict[str, Any]:
        """One job per call on a fixed schedule: open loop, so a slow call does not hold the next ones
        back (a system's own latency must not lower the load it is measured under)."""
        count = int(rate * seconds)
        flight = InFlight()
        t0 = time.time() + 0.05
        for i in range(count):
            await _sleep_until(t0 + i / rate)
            await flight.issue(lambda seq=first_seq + i: self.adapter.enqueue(Job(seq, time.time(), 0.0)), 1)
        await flight.wait()
        return _phase(first_seq, count, flight.failed, t0, time.time())

    async def _burst(self, first_seq: int, rate: float, seconds: float, batch: int) -> dict[str, Any]:
        """Batches of ``batch`` jobs at ``rate`` jobs/s through the bulk API for ``seconds``, open loop
        up to MAX_IN_FLIGHT calls; a producer that still falls behind sends fewer (its rate is reported)."""
        count = int(rate * seconds)
        flight = InFlight()
        t0 = time.time() + 0.01
        for start in range(0, count, batch):
            await _sleep_until(t0 + start / rate)
            if time.time() > t0 + seconds:
                count = start
                break
            seqs = range(first_seq + start, first_seq + min(count, start + batch))
            await flight.issue(
                lambda seqs=seqs: self.adapter.enqueue_batch([Job(seq, time.time(), 0.0) for seq in seqs]),
                len(seqs),
            )
        await flight.wait()
        return _phase(first_seq, count, flight.failed, t0, time.time())

    async def delay(self, params: dict[str, Any]) -> dict[str, Any]:
        base = self.starts() + WARM_UP_JOBS
        workers = await self.start_workers(params["processes"])
        try:
            instant = await self._due_at_one_instant(0, params["instant_jobs"], params["instant_lead_s"])
            in_time = await self.wait_starts(base + instant["sent"], params["timeout"])
            sequential = await self._one_after_another(
                instant["seq_end"], params["sequential_jobs"], params["sequential_delay_s"]
            )
            await self.settle_work()
        finally:
            workers.stop()
        return {"instant": instant, "sequential": sequential, "complete": in_time and sequential["complete"]}

    async def _due_at_one_instant(self, first_seq: int, count: int, lead: float) -> dict[str, Any]:
        """Through the bulk API in batches of 100, so even a slow producer is done before they are due."""
        due = time.time() + lead
        for start in range(first_seq, first_seq + count, 100):
            now = time.time()
            stop = min(first_seq + count, start + 100)
            await self.adapter.enqueue_batch([Job(seq, now, due) for seq in range(start, stop)])
        phase = _phase(first_seq, count, 0, due, due)
        phase["enqueued_before_due"] = time.time() < due
        return phase

    async def _one_after_another(self, first_seq: int, count: int, delay: float) -> dict[str, Any]:
        """Each job is enqueued once the one before it started, so the workers are idle when it is due."""
        complete = True
        t0 = time.time()
        for seq in range(first_seq, first_seq + count):
            before = self.starts()
            now = time.time()
            await self.adapter.enqueue(Job(seq, now, now + delay))
            complete = await self.wait_starts(before + 1, delay + 10) and complete
            await asyncio.sleep(0.02)
        return {**_phase(first_seq, count, 0, t0, time.time()), "complete": complete}

    async def lease(self, params: dict[str, Any]) -> dict[str, Any]:
        """Run ``jobs`` of the pending ones with fresh workers (the rest stay pending)."""
        base = self.starts()
        workers = await self.start_workers(params["processes"], warm_up=False)
        try:
            done = await self.wait_starts(base + params["jobs"], params["timeout"])
        finally:
            workers.stop()
        return {"jobs": params["jobs"], "complete": done}


def _phase(first_seq: int, count: int, failed: int, start: float, end: float) -> dict[str, Any]:
    return {"seq_start": first_seq, "seq_end": first_seq + count, "sent": count, "failed": failed,
            "start": start, "end": end}  # fmt: skip


async def _sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


def main(make_adapter: Callable[[], Adapter]) -> None:
    action, params = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result = asyncio.run(_run(make_adapter(), action, params))
    print(RESULT_PREFIX + json.dumps(result), flush=True)


async def _run(adapter: Adapter, action: str, params: dict[str, Any]) -> dict[str, Any]:
    driver = Driver(adapter)
    if action == "versions":
        return await driver.versions(params)
    work = params.get("work", "noop")
    if work not in KINDS:
        raise ValueError(f"work {work!r}: choose from {', '.join(KINDS)}")
    adapter.worker_concurrency = params.get("concurrency") or adapter.concurrency[work]
    os.environ[WORK_ENV] = work  # the workers this driver starts inherit both
    os.environ[CONCURRENCY_ENV] = str(adapter.worker_concurrency)
    await adapter.open()
    try:
        result: dict[str, Any] = await getattr(driver, action)(params)
    finally:
        await adapter.close()
    return {**result, "work": work, "worker_concurrency": adapter.worker_concurrency}

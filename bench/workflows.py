"""What a dependency edge costs (issue 21): a chain of fan-ins against the same jobs without edges,
in one run.

    python -m bench.workflows [--groups 100] [--width 99] [--rounds 2] [--processes 1]

A private redis-server and a fresh PostgreSQL database; a dispatcher (``dispatcher run``,
``--processes``) and one worker process (concurrency 256) whose handler writes the wall time at its
start and its end to a file. The graph: ``--groups`` groups of ``--width`` children and a join that
waits for them; each group's children wait for the previous group's join. With the defaults that is
10,000 jobs and 19,800 edges, enqueued group by group (each group one ``enqueue_many``, one
transaction). The same 10,000 jobs without edges are then enqueued in the same requests. Each run's
jobs/s is from the first enqueue to the last job's end (by the handlers' clocks), the runs
alternating in order between rounds.

Also the delay from a dependency's end to its dependent's start: for every join, from the end of
its last child (fan-in); for every child of the next group, from the end of the join it waited for
(fan-out: a join's end releases ``--width`` jobs at once). Printed as p50/p99 (ms) of each. The
handler's end is a little before its ack reaches the dispatcher: the delay includes the ack's trip,
the status writer's batch (its flush interval), the resolution, the push, the lease and the read
of the dependencies' results that goes with it.

First (``--store-rounds``, 0 to skip), what the edge lookup adds to the status writer's batches for
jobs nothing waits for, which every user pays; then (``--wide``, 0 to skip) the status batch that
ends one job 20,000 jobs wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dispatcher.store import JobRow, StoreUpdate, dependencies
from dispatcher.store.open import open_store
from shardq_common.clock import wall_ms
from worker_sdk import Client, JobContext, serve

from .infra.dispatcher import Dispatcher
from .infra.postgres import Postgres
from .infra.redis_server import PrivateRedis


def _worker(target: str, ledger: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    async def handle(ctx: JobContext) -> bytes:
        start = time.time()
        end = time.time()
        os.write(fd, f"{ctx.job_id} {start:.6f} {end:.6f}\n".encode())
        return b"1"

    serve({"wf": handle}, target=target, concurrency=256)


def _read(ledger: Path) -> dict[str, tuple[float, float]]:
    out = {}
    for line in ledger.read_text().splitlines():
        job_id, start, end = line.split()
        out[job_id] = (float(start), float(end))
    return out


def _run(
    target: str, ledger: Path, groups: int, width: int, edges: bool
) -> tuple[float, dict[str, list[float]]]:
    ledger.write_text("")
    ids: list[tuple[list[str], str]] = []  # per group: children, join
    began = time.time()
    with Client(target, timeout=60) as client:
        previous = ""
        for _ in range(groups):
            specs = [
                {"type": "wf", "ref": f"c{i}", **({"depends_on": [previous]} if edges and previous else {})}
                for i in range(width)
            ]
            specs.append({"type": "wf", **({"depends_on": [f"c{i}" for i in range(width)]} if edges else {})})
            got = client.enqueue_many(specs)
            ids.append((got[:-1], got[-1]))
            previous = got[-1]
    total = groups * (width + 1)
    deadline = time.time() + 600
    while True:
        done = _read(ledger)
        if len(done) >= total:
            break
        if time.time() > deadline:
            raise SystemExit(f"only {len(done)} of {total} jobs ran in 10 minutes")
        time.sleep(0.2)
    rate = total / (max(end for _, end in done.values()) - began)
    delays: dict[str, list[float]] = {"fan-in": [], "fan-out": []}
    if edges:
        for g, (children, join) in enumerate(ids):
            delays["fan-in"].append(done[join][0] - max(done[c][1] for c in children))
            if g:
                delays["fan-out"] += [done[c][0] - done[ids[g - 1][1]][1] for c in children]
    return rate, delays


async def _resolution_share(db_url: str, rounds: int, batch: int) -> None:
    """What the edge lookup adds to a status batch whose jobs nothing waits for (every user pays it):
    per round, ``batch`` fresh leased rows get their success recorded (apply_updates, which looks
    for open edges of the finished jobs in the same transaction), and the lookup alone is timed on
    another ``batch`` finished rows. Prints the median µs per job of each."""
    store = await open_store(db_url)
    await store.migrate()
    whole, lookup = [], []
    try:
        for n in range(rounds):
            now = wall_ms()
            rows = [
                JobRow(f"r{n}-{i:06d}", "bench", 0, 1, b"", "leased", now, now + 60_000, 1, 0, 0, 5, 60_000,
                       None, None, None, None, now, now, None, now)
                for i in range(2 * batch)
            ]  # fmt: skip
            await store.insert_jobs(rows)
            updates = [StoreUpdate(r.id, "succeeded", attempts=1, finished_at=now) for r in rows[:batch]]
            began = time.perf_counter()
            await store.apply_updates(updates)
            whole.append((time.perf_counter() - began) / batch * 1e6)
            await store.apply_updates(
                [StoreUpdate(r.id, "succeeded", attempts=1, finished_at=now) for r in rows[batch:]]
            )
            async with store.transaction() as tx:
                began = time.perf_counter()
                await dependencies.resolve(tx, [r.id for r in rows[batch:]], now)
                lookup.append((time.perf_counter() - began) / batch * 1e6)
    finally:
        await store.close()
    print(
        f"status batch of {batch:,} successes, nothing waiting on them: "
        f"{statistics.median(whole):.1f} µs per job, "
        f"of which the edge lookup {statistics.median(lookup):.1f} µs "
        f"({statistics.median(lookup) / statistics.median(whole):.1%}; medians of {rounds} rounds)",
        flush=True,
    )


async def _wide_release(db_url: str, dependents: int) -> None:
    """A status batch that records the end of one job ``dependents`` waiting jobs wait for (a fan-out
    as wide as an import that releases a job per customer): the batch's seconds, in which that
    process's other status writes wait, and how many it released."""
    store = await open_store(db_url)
    await store.migrate()
    released: list[str] = []
    store.on_resolved = lambda promoted, cancelled: released.extend(r.id for r in promoted)
    try:
        now = wall_ms()
        row = JobRow("wide-root", "bench", 0, 1, b"", "leased", now, now + 60_000, 1, 0, 0, 5, 60_000,
                     None, None, None, None, now, now, None, now)  # fmt: skip
        waiting = [
            JobRow(f"wide-{i:06d}", "bench", 0, 1, b"", "waiting", now, None, 0, 0, 0, 5, 60_000,
                   None, None, None, None, now, None, None, now, deps_remaining=1)
            for i in range(dependents)
        ]  # fmt: skip
        await store.insert_jobs([row])
        await store.insert_graph(
            waiting, [dependencies.Edge(w.id, row.id) for w in waiting], lambda t: True, str
        )
        began = time.perf_counter()
        await store.apply_updates(
            [StoreUpdate(row.id, "succeeded", attempts=1, finished_at=now, result=b"r")]
        )
        seconds = time.perf_counter() - began
    finally:
        await store.close()
    print(
        f"status batch finishing one job {dependents:,} jobs wait for: {seconds:.2f} s, "
        f"{len(released):,} released",
        flush=True,
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--width", type=int, default=99)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--store-rounds", type=int, default=10, help="0: skip the status batch's cost")
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument(
        "--wide", type=int, default=20_000, help="dependents of the one job the wide release ends (0: skip)"
    )
    parser.add_argument("--worker", nargs=2, metavar=("TARGET", "LEDGER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    logs = Path(tempfile.mkdtemp(prefix="shardq-workflows-bench-"))
    redis_server = PrivateRedis().start()
    postgres = Postgres().start()
    database = postgres.new_database()
    dispatcher = Dispatcher(redis_server.url, database.url, logs / "dispatcher", args.processes)
    ledger = logs / "ledger.txt"
    worker = None
    ratios: list[float] = []
    all_delays: dict[str, list[float]] = {"fan-in": [], "fan-out": []}
    try:
        if args.store_rounds:
            asyncio.run(_resolution_share(database.url, args.store_rounds, args.batch))
        if args.wide:
            asyncio.run(_wide_release(database.url, args.wide))
        dispatcher.start()
        worker = subprocess.Popen(
            [sys.executable, "-m", "bench.workflows", "--worker", dispatcher.target, str(ledger)],
            stdout=subprocess.DEVNULL,
            stderr=open(logs / "worker.log", "w"),  # noqa: SIM115 - closed with the process
        )
        for n in range(args.rounds):
            order = (True, False) if n % 2 == 0 else (False, True)
            rates = {}
            for edges in order:
                rates[edges], delays = _run(dispatcher.target, ledger, args.groups, args.width, edges)
                for kind, values in delays.items():
                    all_delays[kind] += values
            ratios.append(rates[True] / rates[False])
            print(
                f"round {n + 1}: with edges {rates[True]:,.0f} jobs/s, without {rates[False]:,.0f} jobs/s, "
                f"with/without {ratios[-1]:.3f}",
                flush=True,
            )
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        dispatcher.stop()
        database.drop()
        postgres.stop()
        redis_server.stop()
        shutil.rmtree(logs, ignore_errors=True)
    if not ratios:  # --rounds 0: the status batch's cost only
        return
    total = args.groups * (args.width + 1)
    edges_n = args.groups * args.width * 2 - args.width
    print(
        f"workflows: {total:,} jobs as {args.groups} fan-ins of {args.width} ({edges_n:,} edges): jobs/s "
        f"with/without edges median {statistics.median(ratios):.3f} over {len(ratios)} rounds",
        flush=True,
    )
    everything = all_delays["fan-in"] + all_delays["fan-out"]
    for kind, values in (*all_delays.items(), ("all", everything)):
        print(
            f"dependency end -> dependent start, {kind}: p50 {_percentile(values, 0.5) * 1000:.1f} ms, "
            f"p99 {_percentile(values, 0.99) * 1000:.1f} ms ({len(values):,} delays)",
            flush=True,
        )


if __name__ == "__main__":
    main()

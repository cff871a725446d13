"""The worker's own CPU per job: what the SDK costs around a handler that does nothing.

    python -m bench.worker_cost [--jobs 60000] [--handler async|sync|both] [--concurrency 1024]
                                [--rounds 1] [--profile DIR]

Starts a private redis-server, a fresh PostgreSQL database (as ``python -m bench run`` does) and a
2-process dispatcher, enqueues the jobs with no worker connected, then starts one worker process
with a no-op handler of the chosen kind and lets it drain them. The worker measures its own process
CPU time (user + system, every thread: the event loop, gRPC's and the handler pool's) over the
middle 80% of the jobs, so start-up and the last stragglers are left out, and prints microseconds
of worker CPU per job and the drain rate over that window.

``--profile DIR`` also samples the worker with py-spy from the start of that window to the end of
the run and writes the raw stacks (``DIR/<handler>.txt``) and a summary of where the worker's
samples fall by stage (stream read, lease to task, handler dispatch, result batching and writes,
heartbeats, handler threads, gRPC and event-loop internals).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .infra.stack import shardq_stack

ROOT = Path(__file__).resolve().parents[1]
JOB_TYPES = [f"cost{i}" for i in range(8)]
RESULT_PREFIX = "WORKER-COST "
WINDOW_OPEN = "WORKER-COST-WINDOW-OPEN"  # the worker is past start-up: sampling begins here

# py-spy frames, matched by function name and file, summed into the stages a job passes through.
# The first stage whose pattern appears in a sample's stack takes the sample (most specific first).
STAGES = [
    ("handler (the no-op itself)", ("noop_async", "noop_sync")),
    ("heartbeats", ("_heartbeats",)),
    ("result batching and writes", ("_sender", "_parts", "_encode_result")),
    ("job start (lease to task)", ("Worker._start (", "JobContext")),
    ("job run (task, outcome, wake-ups)", ("_execute", "_invoke", "_invoke_in_thread", "_within_budget")),
    ("handler threads (pool)", ("_worker (concurrent/futures/thread.py", "ThreadPoolExecutor")),
    ("stream read and decode", ("_session", "read (grpc/")),
    ("gRPC internals", ("(grpc/",)),
    ("event loop", ("run_forever", "_run_once", "uvloop", "run (asyncio")),
    ("other threads (gRPC's poller)", ("Thread.run (",)),
]
# A sample with no Python frame at all: a thread in C, waiting for the GIL or inside gRPC's core.
NATIVE = "native code (GIL waits, gRPC core)"


def _worker_main(kind: str, jobs: int, concurrency: int) -> None:
    from worker_sdk import serve

    first, last = jobs // 10, jobs - jobs // 10
    seen = 0
    marks: dict[str, tuple[float, float]] = {}

    def count() -> None:
        nonlocal seen
        seen += 1
        if seen == first or seen == last:
            times = os.times()
            marks["first" if seen == first else "last"] = (times.user + times.system, time.monotonic())
            if seen == first:
                print(WINDOW_OPEN, flush=True)
            if seen == last:
                (cpu0, wall0), (cpu1, wall1) = marks["first"], marks["last"]
                window = last - first
                print(
                    RESULT_PREFIX
                    + json.dumps(
                        {
                            "handler": kind,
                            "jobs_measured": window,
                            "cpu_us_per_job": round((cpu1 - cpu0) / window * 1e6, 2),
                            "jobs_per_s": round(window / (wall1 - wall0)),
                        }
                    ),
                    flush=True,
                )

    async def noop_async(ctx: Any) -> None:
        count()

    def noop_sync(ctx: Any) -> None:
        count()

    handler = noop_async if kind == "async" else noop_sync
    serve({name: handler for name in JOB_TYPES}, concurrency=concurrency, shutdown_grace=2)


def _fill(target: str, jobs: int) -> None:
    from worker_sdk import Client

    with Client(target, route=True) as client:
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            client.enqueue_many([{"type": JOB_TYPES[(start + i) % len(JOB_TYPES)]} for i in range(count)])


def _summarize(raw: Path) -> list[tuple[str, float]]:
    """Share of the samples per stage, from py-spy's raw (collapsed) output."""
    totals: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        n = int(count_text)
        samples += n
        stage = next((name for name, marks in STAGES if any(m in stack for m in marks)), NATIVE)
        totals[stage] += n
    return [(stage, 100 * n / samples) for stage, n in totals.most_common()] if samples else []


def measure(kind: str, jobs: int, concurrency: int, profile: Path | None) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="shardq-worker-cost-"))
    with shardq_stack(logs / "dispatcher") as stack:
        _fill(stack.dispatcher.target, jobs)
        env = {**os.environ, "SHARDQ_TARGET": stack.dispatcher.target, "SHARDQ_LOG_LEVEL": "warning"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        argv = [sys.executable, "-m", "bench.worker_cost", "--worker", kind, "--jobs", str(jobs),
                "--concurrency", str(concurrency)]  # fmt: skip
        worker = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        try:
            result = _read_result(worker, kind, profile)
        finally:
            worker.terminate()
            worker.wait(30)
    if not result:
        raise RuntimeError(f"the worker printed no result; logs kept in {logs}")
    shutil.rmtree(logs, ignore_errors=True)
    return result


def _read_result(worker: subprocess.Popen[str], kind: str, profile: Path | None) -> dict[str, Any]:
    """The worker's measurement; with a profile, py-spy samples it from the window's start."""
    assert worker.stdout is not None
    spy = None
    result: dict[str, Any] = {}
    try:
        for line in worker.stdout:
            if line.startswith(WINDOW_OPEN) and profile is not None:
                profile.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [_py_spy(), "record", "--pid", str(worker.pid), "--rate", "500", "--format", "raw",
                     "--output", str(profile / f"{kind}.txt"), "--threads", "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            elif line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX) :])
                break
    finally:
        if spy is not None:
            worker.terminate()  # py-spy ends with the process it samples
            spy.wait(30)
    if spy is not None and result:
        assert profile is not None
        result["stages"] = _summarize(profile / f"{kind}.txt")
    return result


def _py_spy() -> str:
    """py-spy from PATH, else the one installed beside this interpreter (a venv not activated)."""
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--handler", choices=("async", "sync", "both"), default="both")
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the handler kinds this many times")
    parser.add_argument("--profile", type=Path, help="sample the worker with py-spy; write stacks here")
    parser.add_argument("--worker", choices=("async", "sync"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker_main(args.worker, args.jobs, args.concurrency)
        return
    kinds = ("async", "sync") if args.handler == "both" else (args.handler,)
    for _ in range(args.rounds):
        for kind in kinds:
            result = measure(kind, args.jobs, args.concurrency, args.profile)
            print(
                f"{kind:5} handler: {result['cpu_us_per_job']:7.2f} µs of worker CPU per job, "
                f"{result['jobs_per_s']:,} jobs/s over {result['jobs_measured']:,} jobs"
            )
            for stage, share in result.get("stages", []):
                print(f"    {share:5.1f}%  {stage}")


if __name__ == "__main__":
    main()

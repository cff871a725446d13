"""The soak's workload and fault plan, drawn from one seed so a failing run can be replayed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

LANES = 64  # job types
NOOP_LANES = range(0, 58)
FLAKY_LANES = range(58, 62)  # fail 1..3 times, then succeed
FAIL_LANES = range(62, 63)  # always fail: dead-lettered after 5 attempts
HANG_LANES = range(63, 64)  # hang on the first attempt past the workers' job timeout, then succeed
PRIORITIES = ("high", "default", "low")
CRON_TYPE = "noop.cron"


def lane_type(lane: int) -> str:
    if lane in FLAKY_LANES:
        return f"flaky.l{lane:02d}"
    if lane in FAIL_LANES:
        return f"fail.l{lane:02d}"
    if lane in HANG_LANES:
        return f"sleep.l{lane:02d}"
    return f"noop.l{lane:02d}"


ALL_TYPES = [lane_type(lane) for lane in range(LANES)] + [CRON_TYPE]


@dataclass(frozen=True)
class JobPlan:
    index: int
    type: str
    payload: dict[str, object]
    priority: str
    delay: float

    @property
    def always_fails(self) -> bool:
        return self.type.startswith("fail.")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start of the fault phase
    kind: str  # worker-kill, dispatcher-kill, dispatcher-stop, redis-restart, pg-restart, rebalance
    target: int = 0  # which worker / dispatcher process (an index)
    duration: float = 0.0  # SIGSTOP length

    def __str__(self) -> str:
        extra = f" for {self.duration:.1f}s" if self.duration else ""
        return f"t={self.at:5.1f}s {self.kind}#{self.target}{extra}"


@dataclass(frozen=True)
class SoakPlan:
    seed: int
    jobs: list[JobPlan]
    faults: list[Fault]
    duration: float
    workers: int
    dispatchers: int
    concurrency: int = 16
    job_timeout: float = 3.0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for j in self.jobs:
            kind = j.type.split(".")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        lines = [
            f"soak seed={self.seed}: {len(self.jobs)} jobs over {LANES} types {kinds}, "
            f"{self.dispatchers} dispatcher processes, {self.workers} workers x {self.concurrency}, "
            f"faults over {self.duration:.0f}s:",
            *(f"  {f}" for f in self.faults),
        ]
        return "\n".join(lines)


def make_plan(seed: int, jobs: int, duration: float, workers: int = 4, dispatchers: int = 4) -> SoakPlan:
    rng = random.Random(seed)
    weights = [0.0] * LANES
    for lane in NOOP_LANES:
        weights[lane] = 0.93 / len(NOOP_LANES)
    for lane in FLAKY_LANES:
        weights[lane] = 0.05 / len(FLAKY_LANES)
    for lane in FAIL_LANES:
        weights[lane] = 0.01 / len(FAIL_LANES)
    for lane in HANG_LANES:
        weights[lane] = 0.01 / len(HANG_LANES)
    planned = []
    for i in range(jobs):
        lane = rng.choices(range(LANES), weights)[0]
        job_type = lane_type(lane)
        payload: dict[str, object] = {"i": i}
        if job_type.startswith("flaky."):
            payload["fail_times"] = rng.randint(1, 3)
        if job_type.startswith("sleep."):
            payload.update(sleep=30, sleep_attempts=1)
        delay = rng.uniform(0, duration / 3) if rng.random() < 0.2 else 0.0
        planned.append(JobPlan(i, job_type, payload, rng.choice(PRIORITIES), delay))
    faults: list[Fault] = []
    t = rng.uniform(2, 4)
    while t < duration:
        faults.append(Fault(round(t, 1), "worker-kill", rng.randrange(workers)))
        t += rng.uniform(3, 6)
    # One of each of the others, spread over the run in a seeded order, apart from each other.
    others = ["dispatcher-kill", "dispatcher-stop", "redis-restart", "pg-restart", "rebalance"]
    rng.shuffle(others)
    slot = duration * 0.8 / len(others)
    for n, kind in enumerate(others):
        at = round(duration * 0.1 + n * slot + rng.uniform(0, slot * 0.3), 1)
        faults.append(
            Fault(at, kind, rng.randrange(dispatchers), duration=4.0 if kind == "dispatcher-stop" else 0.0)
        )
    faults.sort(key=lambda f: f.at)
    return SoakPlan(seed, planned, faults, duration, workers, dispatchers)

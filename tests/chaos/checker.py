"""After a soak: prove from the workers' ledger and the database what the queue promises.

- every enqueue that returned OK is a row in the DB;
- every job succeeded at least once (an "end" in the ledger and status succeeded), except exactly
  the always-failing ones, which are dead after 5 attempts;
- no job had two overlapping executions under valid leases: an overlap is only allowed when a
  fault that can invalidate leases (a dispatcher killed or stopped, Redis losing its data)
  happened between the two starts;
- cron occurrences: no two jobs for one occurrence, no gap except around a fault window;
- duplicate executions (a run after the job already ran to its end) are counted and stay within
  what the injected faults can cause.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .plan import Fault, SoakPlan

LEASE_FAULTS = {"dispatcher-kill", "dispatcher-stop", "redis-restart"}
CRON_GAP_FAULTS = {"dispatcher-kill", "dispatcher-stop", "redis-restart", "pg-restart"}


@dataclass
class Execution:
    job: str
    token: str
    pid: int
    start: float
    end: float | None = None  # None: it never finished (worker killed, or abandoned on timeout)
    outcome: str = ""  # "end" or "fail"


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        figures = ", ".join(f"{k} {v}" for k, v in self.figures.items())
        if self.ok:
            return f"VERDICT ok: {figures}"
        return f"VERDICT FAILED ({len(self.problems)} problems: {'; '.join(self.problems[:5])}): {figures}"


def executions(ledger: list[dict[str, Any]]) -> tuple[dict[str, list[Execution]], list[str]]:
    """Each job's executions by start time, and the tokens that started more than one execution
    (a lease token is handed out once: a second start under it is a double hand-out)."""
    by_token: dict[tuple[str, str], Execution] = {}
    reused: list[str] = []
    for e in ledger:
        key = (e["job"], e["token"])
        if e["event"] == "start":
            if key in by_token:
                reused.append(f"{e['job']}/{e['token']}")
            by_token[key] = Execution(e["job"], e["token"], e["pid"], e["t"])
        elif key in by_token and e["event"] in ("end", "fail"):
            by_token[key].end = e["t"]
            by_token[key].outcome = e["event"]
    out: dict[str, list[Execution]] = defaultdict(list)
    for ex in by_token.values():
        out[ex.job].append(ex)
    for runs in out.values():
        runs.sort(key=lambda x: x.start)
    return out, reused


def check(
    plan: SoakPlan,
    ids: dict[int, str],
    rows: dict[str, tuple[str, int, int, int]],
    ledger: list[dict[str, Any]],
    fault_times: list[tuple[float, Fault]],
    killed_pids: dict[int, float],
    cron_runs: list[int],
) -> Verdict:
    """ids: plan index -> job id as enqueue returned it. rows: job id -> (status, attempts, failures,
    expirations) from the DB. fault_times: (wall time, fault) as injected. killed_pids: worker pid ->
    SIGKILL time. cron_runs: the schedule's occurrence times (ms) in the DB, one per job."""
    v = Verdict()
    missing = [i for i in range(len(plan.jobs)) if i not in ids]
    if missing:
        v.problems.append(f"{len(missing)} enqueues never returned OK (e.g. #{missing[0]})")
    not_in_db = [job_id for job_id in ids.values() if job_id not in rows]
    if not_in_db:
        v.problems.append(f"{len(not_in_db)} accepted jobs are not in the DB (e.g. {not_in_db[0]})")
    runs, reused = executions(ledger)
    if reused:
        v.problems.append(f"{len(reused)} lease tokens started two executions (e.g. {reused[0]})")
    fail_ids = {ids[j.index] for j in plan.jobs if j.always_fails and j.index in ids}
    succeeded = dead = 0
    for job in plan.jobs:
        job_id = ids.get(job.index)
        if job_id is None or job_id not in rows:
            continue
        status, _attempts, failures, expirations = rows[job_id]
        if job_id in fail_ids:
            if status != "dead" or failures + expirations != 5:
                v.problems.append(
                    f"always-failing {job_id} is {status} after {failures}+{expirations} attempts"
                )
            dead += status == "dead"
        else:
            ended = any(r.outcome == "end" for r in runs.get(job_id, []))
            if status != "succeeded" or not ended:
                v.problems.append(f"{job_id} ({job.type}) is {status}, ran to its end: {ended}")
            succeeded += status == "succeeded"
    # Overlaps under valid leases.
    lease_faults = sorted(t for t, f in fault_times if f.kind in LEASE_FAULTS)
    explained = unexplained = 0
    duplicates = 0
    for job_id, job_runs in runs.items():
        for r in job_runs:
            if r.end is None:  # killed with its worker, or abandoned at the job timeout
                killed = killed_pids.get(r.pid)
                abandoned = r.start + plan.job_timeout
                r.end = min(killed, abandoned) if killed is not None and killed >= r.start else abandoned
        for a, b in zip(job_runs, job_runs[1:], strict=False):
            if b.start < (a.end or a.start):
                if any(a.start - 1.0 <= t <= b.start for t in lease_faults):
                    explained += 1
                else:
                    unexplained += 1
                    v.problems.append(
                        f"{job_id}: executions overlap with no fault to explain it: "
                        f"pid {a.pid} {a.start:.3f}..{a.end:.3f} ({a.outcome or 'unfinished'}), "
                        f"pid {b.pid} from {b.start:.3f}"
                    )
        first_end = next((r.end for r in job_runs if r.outcome == "end"), None)
        if first_end is not None:
            duplicates += sum(1 for r in job_runs if r.start > first_end)
    worker_kills = sum(1 for _, f in fault_times if f.kind == "worker-kill")
    big_faults = sum(1 for _, f in fault_times if f.kind in LEASE_FAULTS)
    capacity = plan.workers * plan.concurrency
    bound = worker_kills * plan.concurrency + big_faults * capacity
    if duplicates > bound:
        v.problems.append(f"{duplicates} duplicate executions, more than the faults explain ({bound})")
    # Cron: one job per occurrence, no gap outside a fault window.
    doubled = sorted(at for at, n in Counter(cron_runs).items() if n > 1)
    if doubled:
        v.problems.append(f"{len(doubled)} cron occurrences materialized twice (e.g. {doubled[:3]})")
    cron = sorted(set(cron_runs))
    windows = [(t - 2.0, t + 20.0) for t, f in fault_times if f.kind in CRON_GAP_FAULTS]
    gaps = 0
    for a, b in zip(cron, cron[1:], strict=False):
        if b - a > 1000:
            if not any(lo <= a / 1000 and b / 1000 <= hi for lo, hi in windows):
                gaps += 1
                v.problems.append(f"cron gap {a}..{b} outside any fault window")
    if not cron:
        v.problems.append("no cron occurrence ran")
    v.figures.update(
        accepted=f"{len(ids)}/{len(plan.jobs)}",
        succeeded=succeeded,
        dead=f"{dead}/{len(fail_ids)}",
        executions=sum(len(r) for r in runs.values()),
        duplicates=f"{duplicates} (bound {bound})",
        overlaps_explained=explained,
        cron_occurrences=len(cron),
        cron_gaps=gaps,
        faults=len(fault_times),
    )
    return v

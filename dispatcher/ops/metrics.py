"""Prometheus metrics, served at /metrics on SHARDQ_METRICS_LISTEN (default 0.0.0.0:9464).

Two kinds:

* Events counted by the process that saw them (enqueues, leases, acks, nacks, expiries,
  dead-letters, reconciler repairs, latency histograms, connected workers). Under a supervisor
  every child writes them to PROMETHEUS_MULTIPROC_DIR and the supervisor's /metrics sums them.
* The state of the queues, which is the cluster's, not a process's: depth by type, priority
  class and state, oldest ready job, shard owners and epochs. The process serving /metrics
  reads them from Redis at scrape time (cluster/state_metrics.py), so every scrape is current.

Job types become a label value only for the first SHARDQ_METRICS_MAX_TYPES types a process
sees (default 100); the rest are counted as type="other", which bounds the cardinality.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ..queue.states import Priority

PRIORITY_NAMES = {int(p): p.name.lower() for p in Priority}
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
_gauge_mode: dict[str, Any] = {"multiprocess_mode": "livesum"} if _MULTIPROCESS else {}

ENQUEUED = Counter("shardq_jobs_enqueued_total", "Jobs accepted (committed to the DB).", ["type"])
LEASED = Counter("shardq_jobs_leased_total", "Leases handed to workers.", ["type"])
ACKED = Counter("shardq_jobs_acked_total", "Jobs that succeeded.", ["type"])
NACKED = Counter("shardq_jobs_nacked_total", "Handler failures reported by workers.", ["type"])
EXPIRED = Counter(
    "shardq_leases_expired_total", "Leases that expired (worker crash, hang, disconnect).", ["type"]
)
RETURNED = Counter(
    "shardq_leases_returned_total",
    "Leases taken back before their worker received them (granted ahead of run_at; a cancel, a "
    "drain or a dropped stream came first), by what the job became: ready or cancelled.",
    ["type", "outcome"],
)
RATE_LIMITED = Counter(
    "shardq_jobs_rate_limited_total",
    "Jobs whose handler raised RateLimited: put back after its delay, no attempt charged.",
    ["type"],
)
PROGRESS_REPORTS = Counter(
    "shardq_progress_reports_total", "Progress reports received from workers (each job's latest, coalesced)."
)
PROGRESS_WRITES = Counter("shardq_progress_writes_total", "Progress reports written to the DB (rows).")
WATCHES = Gauge(
    "shardq_watches", "WatchJob streams open in this process (at most SHARDQ_MAX_WATCHES).", **_gauge_mode
)
ENQUEUE_STREAMS = Gauge(
    "shardq_enqueue_streams",
    "EnqueueStream calls open in this process (a producer's single enqueues).",
    **_gauge_mode,
)
PROMOTED_FROM_WAITING = Counter(
    "shardq_jobs_promoted_total",
    "Jobs whose dependencies all finished, moved out of 'waiting' by a commit of this process (issue 21).",
)
DEPENDENCY_CANCELLED = Counter(
    "shardq_jobs_dependency_cancelled_total",
    "Waiting jobs cancelled because a dependency failed under the 'fail' policy (issue 21).",
)
DEAD = Counter("shardq_jobs_dead_lettered_total", "Jobs moved to the dead-letter queue.", ["type", "reason"])
LEASE_HELD_BACK = Counter(
    "shardq_lease_held_back_total",
    "Lease calls in which flow control held a type back, by why: paused, concurrency, rate, "
    "key_concurrency or key_rate (once per call and reason, not per job).",
    ["type", "reason"],
)
SCHEDULE_MATERIALIZED = Counter(
    "shardq_schedule_occurrences_materialized_total", "Schedule occurrences that became jobs.", ["type"]
)
SCHEDULE_SKIPPED = Counter(
    "shardq_schedule_occurrences_skipped_total",
    "Missed schedule occurrences the catch-up policy did not run.",
    ["type"],
)
REDIS_ERRORS = Counter(
    "shardq_redis_errors_total",
    "Redis errors met and survived (the caller backs off and tries again), by where (a loop such as "
    "promoter, reaper, lease, worker_stream, coordinator; or rpc) and kind: connection, timeout, a "
    "transient error reply (readonly, oom, misconf, noreplicas, busy, loading, masterdown, tryagain, "
    "clusterdown) or other (an error reply that is no outage, most likely a bug: logged as an error).",
    ["loop", "kind"],
)
RESTORED = Counter(
    "shardq_reconciler_restored_total",
    "Jobs the reconciler put back into Redis from the DB, by cause: lost (Redis lost them: a restart "
    "without persistence, a flush, a failover, deleted keys) or unpushed (committed jobs whose push "
    "failed, e.g. no process owned their shard for a moment: expected, nothing was lost).",
    ["cause"],
)
PUSHED = Counter(
    "shardq_jobs_pushed_total",
    "Committed jobs the enqueue path put into Redis (with shardq_reconciler_restored_total, every job "
    "accepted is counted once; a push that finds its job there already, or cancelled, counts none).",
)
ENQUEUE_TO_START = Histogram(
    "shardq_enqueue_to_start_seconds",
    "From enqueue to the first lease of a job.",
    ["priority"],
    buckets=LATENCY_BUCKETS,
)
LATENESS = Histogram(
    "shardq_start_lateness_seconds",
    "From a job's run_at to its lease.",
    ["priority"],
    buckets=LATENCY_BUCKETS,
)
WORKERS = Gauge("shardq_connected_workers", "Worker streams connected.", **_gauge_mode)
FREE_CREDIT = Gauge(
    "shardq_worker_free_credit", "Lease slots workers have granted and not used yet.", **_gauge_mode
)
IN_FLIGHT = Gauge("shardq_inflight_leases", "Leases held by connected workers.", **_gauge_mode)
# Set by each process's health check; under a supervisor the lowest answer of the live children.
DEPENDENCY_UP = Gauge(
    "shardq_dependency_up",
    "1 when this dispatcher's last health check reached the dependency (redis, database), else 0.",
    ["dependency"],
    multiprocess_mode="livemin",
)
# Every process reads the same number from the DB: under a supervisor the largest is the answer.
WAITING_DEPTH = Gauge(
    "shardq_jobs_waiting",
    "Jobs waiting for their dependencies (issue 21; in the DB only), as of the last health round.",
    **({"multiprocess_mode": "max"} if _MULTIPROCESS else {}),
)
DEAD_DEPTH = Gauge(
    "shardq_dead_letter_depth",
    "Jobs in the dead-letter queue.",
    ["type", "priority"],
    **({"multiprocess_mode": "max"} if _MULTIPROCESS else {}),
)

PRUNED = Counter(
    "shardq_jobs_pruned_total",
    "Finished jobs' rows deleted by retention or by `dispatcherctl jobs prune`, by type and status "
    "(succeeded, cancelled, dead).",
    ["type", "status"],
)
# Set by each shard's owner at every retention pass; a shard lives in one process at a time.
OLDEST_FINISHED = Gauge(
    "shardq_oldest_finished_job_age_seconds",
    "Age of the oldest finished row of the shard's job types, by status (succeeded, cancelled, "
    "dead), as of the owner's last retention pass. Stays under the retention period while "
    "retention keeps up.",
    ["shard", "status"],
    **({"multiprocess_mode": "livemax"} if _MULTIPROCESS else {}),
)
RETENTION_OVERDUE = Gauge(
    "shardq_retention_overdue_seconds",
    "How far past its type's retention period the shard's most overdue finished row is (0: none "
    "is), as of the owner's last retention pass: retention falling behind.",
    ["shard"],
    **({"multiprocess_mode": "livemax"} if _MULTIPROCESS else {}),
)

# The database's size and partitions (PostgreSQL), as of the process's last partition keeper pass:
# every dispatcher reads them, so the largest value across processes is current.
DB_PARTITIONS = Gauge(
    "shardq_db_partitions",
    "Partitions of the jobs table (PostgreSQL), by kind: fresh (retired whole once past retention), "
    "ahead (the fresh ones after the current interval, created in advance), kept (a retired "
    "partition's survivors, pruned row by row), legacy (the table as it was before partitioning) "
    "and default (ids no partition covers).",
    ["kind"],
    **({"multiprocess_mode": "livemax"} if _MULTIPROCESS else {}),
)
DB_TABLE_BYTES = Gauge(
    "shardq_db_table_bytes",
    "Bytes on disk of a table, its indexes and TOAST included (jobs: every partition; job_idem_keys; "
    "job_attempts), as of the process's last partition keeper pass (SQLite: the jobs table and its "
    'indexes, and the file as table="file").',
    ["table"],
    **({"multiprocess_mode": "livemax"} if _MULTIPROCESS else {}),
)
PARTITIONS_DROPPED = Counter(
    "shardq_db_partitions_dropped_total",
    "Partitions of the jobs table retention retired, by how: dropped (nothing survived), compacted "
    "(its survivors copied into a small partition of the same range, the rest dropped) or kept (too "
    "many survivors: left whole to the row-by-row pruner).",
    ["how"],
)


def forget_shard_retention(shard: int) -> None:
    """The shard moved: its new owner reports it. Zero, not removed (a supervisor's children share
    files that cannot drop a label set): the largest value across processes is the owner's."""
    for status in ("succeeded", "cancelled", "dead"):
        OLDEST_FINISHED.labels(str(shard), status).set(0)
    RETENTION_OVERDUE.labels(str(shard)).set(0)


# The histograms' children, looked up once rather than per lease.
_LATENCY_CHILDREN = {
    int(p): (ENQUEUE_TO_START.labels(PRIORITY_NAMES[int(p)]), LATENESS.labels(PRIORITY_NAMES[int(p)]))
    for p in Priority
}


def set_dead_depth(counts: dict[tuple[str, int], int]) -> None:
    DEAD_DEPTH.clear()
    by_label: dict[tuple[str, str], int] = {}
    for (job_type, prio), n in counts.items():
        key = (type_label(job_type), PRIORITY_NAMES.get(prio, str(prio)))
        by_label[key] = by_label.get(key, 0) + n
    for (job_type, prio), n in by_label.items():
        DEAD_DEPTH.labels(job_type, prio).set(n)


class TypeLabels:
    """The label value for a job type: itself for the first `limit` types seen, else "other"."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, job_type: str) -> str:
        if job_type in self._known:
            return job_type
        with self._lock:
            if len(self._known) < self.limit:
                self._known.add(job_type)
                return job_type
        return "other"


type_label = TypeLabels(int(os.environ.get("SHARDQ_METRICS_MAX_TYPES", "100")))


def count(counter: Counter, label_sets: Iterable[tuple[str, ...]]) -> None:
    """One increment per distinct label set: a batch of a thousand jobs of one type costs one."""
    for labels, n in collections.Counter(label_sets).items():
        counter.labels(*labels).inc(n)


def observe_leases(leases: Iterable[tuple[str, int, int, int, int]], now: int) -> None:
    """Leases handed out, as (type, priority, enqueued_at, run_at, attempt): counted by type; a first
    attempt's enqueue-to-start and lateness observed by priority."""
    types: dict[str, int] = {}
    waits: dict[int, tuple[list[float], list[float]]] = {}
    for job_type, priority, enqueued_at_ms, run_at_ms, attempt in leases:
        types[job_type] = types.get(job_type, 0) + 1
        if attempt == 1:
            to_start, lateness = waits.setdefault(priority, ([], []))
            to_start.append(max(0.0, (now - enqueued_at_ms) / 1000))
            lateness.append(max(0.0, (now - run_at_ms) / 1000))
    for priority, (to_start, lateness) in waits.items():
        to_start_histogram, lateness_histogram = _LATENCY_CHILDREN[priority]
        observe_many(to_start_histogram, to_start)
        observe_many(lateness_histogram, lateness)
    for job_type, n in types.items():  # labelled once per type, not once per lease
        LEASED.labels(type_label(job_type)).inc(n)


def observe_many(histogram: Any, values: list[float]) -> None:
    """A batch's observations with one write per bucket it hits and one to the sum, where observe()
    makes two per value (under a supervisor, each is a locked write to a shared file)."""
    fields = ("_upper_bounds", "_buckets", "_sum")  # what observe() itself uses
    bounds, buckets, total = (getattr(histogram, name, None) for name in fields)
    if bounds is None or buckets is None or total is None:  # a prometheus_client without these fields
        for value in values:
            histogram.observe(value)
        return
    for index, n in collections.Counter(bisect.bisect_left(bounds, v) for v in values).items():
        buckets[index].inc(n)  # the first bucket whose bound is >= the value, as observe() picks
    if values:
        total.inc(sum(values))

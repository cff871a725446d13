"""Dependencies between jobs (issue 21, migration 0016): the edges of a workflow and their resolution.

A job with dependencies is inserted 'waiting' with ``deps_remaining`` = its dependencies, in the
transaction that inserts its edges, and stays out of Redis. Every transaction that gives a job its
terminal status (a status batch, a cancel) calls ``resolve`` before it commits: each unresolved edge
of the finished jobs is resolved once (``resolved_state IS NULL`` is checked again under the edge's
row lock, so two processes recording the same end resolve it once), each dependent's count goes down
under its row lock, and the dependent whose count reaches zero leaves 'waiting' in that same
transaction. Two dependencies finishing at once in different processes therefore promote their
dependent exactly once: whichever decrement comes second sees zero. The caller pushes the promoted
jobs to Redis after the commit; should that push be lost, the row says 'ready' or 'delayed' and the
shard's reconciler puts it back, as for any committed job.

Under the 'fail' policy a dependency that was dead-lettered or cancelled cancels its dependent at
once (last_error says ``dependency_failed``), and the cancel resolves that job's own dependents in
turn, in the same transaction. Under 'ignore' the dependent counts the failure as finished.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument

if TYPE_CHECKING:
    from .base import Tx

WAITING = "waiting"
FAIL = "fail"
TERMINAL = ("succeeded", "cancelled", "dead")
#: The last_error of a job cancelled because a dependency failed (its prefix; the rest names it).
DEPENDENCY_FAILED = "dependency_failed"
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Edge:
    job_id: str
    depends_on_id: str
    on_failure: str = FAIL


@dataclass
class Resolution:
    """What resolving edges changed: the jobs promoted out of 'waiting' (to push to Redis) and the
    waiting jobs cancelled because a dependency failed."""

    promoted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield list(items[i : i + _CHUNK])


async def check_dependencies(
    tx: Tx, ids: Sequence[str], may_use: Callable[[str], bool], name_of: Callable[[str], str]
) -> None:
    """Refuse (InvalidArgument naming the job) a dependency on a job that does not exist or whose
    type the caller may not use (reported as missing, so another tenant's job is not told). The rows
    are locked: a dependency cannot finish (and resolve its edges without the new ones) before this
    transaction commits its edges."""
    found: dict[str, str] = {}
    lock = " FOR UPDATE" if tx.supports_for_update else ""
    for chunk in _chunks(sorted(set(ids))):
        rows = await tx.execute(f"SELECT id, type FROM jobs WHERE id IN ({_marks(len(chunk))}){lock}", chunk)
        found.update((str(r[0]), str(r[1])) for r in rows)
    for job_id in ids:
        if job_id not in found or not may_use(found[job_id]):
            raise InvalidArgument(f"{name_of(job_id)}: no job {job_id} to depend on")


async def extend_waiting(
    tx: Tx, edges: Sequence[Edge], may_use: Callable[[str], bool], name_of: Callable[[str], str]
) -> None:
    """Give existing waiting jobs one more dependency each (``Edge.job_id`` the waiting job, a new
    job its dependency): a batch grown from inside. Refused, naming the job, unless each is still
    waiting: one whose dependencies all finished has been released already. One cancelled because
    a dependency failed is passed over (a batch's success callback once a job of it died: the jobs
    added still hold up its completion callback). Refused too when a new job already waits, through
    its own dependencies, for a job it would block: the two would wait for each other forever."""
    if not edges:
        return
    lock = " FOR UPDATE" if tx.supports_for_update else ""
    ids = sorted({e.job_id for e in edges})
    found: dict[str, tuple[str, str, str]] = {}
    for chunk in _chunks(ids):
        rows = await tx.execute(
            f"SELECT id, type, status, last_error FROM jobs WHERE id IN ({_marks(len(chunk))}) "
            f"ORDER BY id{lock}",
            chunk,
        )
        found.update((str(r[0]), (str(r[1]), str(r[2]), str(r[3] or ""))) for r in rows)
    for job_id in ids:
        if job_id not in found or not may_use(found[job_id][0]):
            raise InvalidArgument(f"{name_of(job_id)}: no job {job_id} to block")
        _, status, error = found[job_id]
        if status != WAITING and not (status == "cancelled" and error.startswith(DEPENDENCY_FAILED)):
            raise InvalidArgument(
                f"{name_of(job_id)}: job {job_id} is {status}, no longer waiting for dependencies"
            )
    edges = [e for e in edges if found[e.job_id][1] == WAITING]
    await _refuse_cycles(tx, edges, name_of)
    await insert_edges(tx, edges)
    counts: dict[str, int] = defaultdict(int)
    for e in edges:
        counts[e.job_id] += 1
    await tx.executemany(
        "UPDATE jobs SET deps_remaining = deps_remaining + ? WHERE id = ?",
        sorted((n, i) for i, n in counts.items()),
    )


async def _refuse_cycles(tx: Tx, edges: Sequence[Edge], name_of: Callable[[str], str]) -> None:
    """Refuse an edge (a waiting job W to wait for a new job M) when M already waits for W through
    the open edges (M's own, inserted already, and theirs in turn)."""
    blocked_by: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        blocked_by[e.depends_on_id].add(e.job_id)
    for new_id, blocked in sorted(blocked_by.items()):
        rows = await tx.execute(
            "WITH RECURSIVE upstream(id) AS ("
            "SELECT depends_on_id FROM job_dependencies WHERE job_id = ? AND resolved_state IS NULL "
            "UNION SELECT d.depends_on_id FROM job_dependencies AS d JOIN upstream AS u ON d.job_id = u.id "
            "WHERE d.resolved_state IS NULL) "
            f"SELECT id FROM upstream WHERE id IN ({_marks(len(blocked))}) LIMIT 1",
            [new_id, *sorted(blocked)],
        )
        if rows:
            waiting_id = str(rows[0][0])
            raise InvalidArgument(
                f"{name_of(waiting_id)}: job {waiting_id} cannot wait for job {new_id}, which waits for it "
                "through its dependencies (a cycle)"
            )


def distinct_edges(edges: Iterable[Edge]) -> list[Edge]:
    """One edge per (waiting job, dependency); of two with different policies, 'fail' (the one that
    does not run the job after a failure)."""
    out: dict[tuple[str, str], Edge] = {}
    for e in edges:
        seen = out.get((e.job_id, e.depends_on_id))
        if seen is None or (seen.on_failure != FAIL and e.on_failure == FAIL):
            out[(e.job_id, e.depends_on_id)] = e
    return list(out.values())


async def count_edges(tx: Tx, edges: Sequence[Edge]) -> None:
    """Set each new waiting job's deps_remaining to its edges."""
    have: dict[str, int] = defaultdict(int)
    for e in edges:
        have[e.job_id] += 1
    if have:
        counts = sorted((n, job_id) for job_id, n in have.items())
        await tx.executemany("UPDATE jobs SET deps_remaining = ? WHERE id = ?", counts)


async def insert_edges(tx: Tx, edges: Sequence[Edge]) -> None:
    await tx.executemany(
        "INSERT INTO job_dependencies (job_id, depends_on_id, on_failure) VALUES (?, ?, ?) "
        "ON CONFLICT DO NOTHING",
        [(e.job_id, e.depends_on_id, e.on_failure) for e in edges],
    )


async def resolve(tx: Tx, finished: Iterable[str], now: int | None = None) -> Resolution:
    """Resolve the unresolved edges of these jobs that are finished now (the others are skipped), and
    of the jobs this cancels in turn. Call it in the transaction that recorded their ends."""
    now = wall_ms() if now is None else now
    out = Resolution()
    frontier = sorted(set(finished))
    while frontier:
        resolved = await _resolve_edges(tx, frontier)
        if not resolved:
            break
        frontier = []
        # One statement per group of dependents that lose as many edges (and, cancelled, for the
        # same reason), not one per dependent: a job thousands of jobs wait for releases them in a
        # few statements. Each dependent's row lock is taken by the statement, which then reads its
        # latest count, so of two transactions releasing it the second sees zero, as before.
        cancels: dict[tuple[int, str], list[str]] = defaultdict(list)
        releases: dict[int, list[str]] = defaultdict(list)
        for job_id in sorted(resolved):
            count, failed = resolved[job_id]
            if failed:
                cancels[count, failed].append(job_id)
            else:
                releases[count].append(job_id)
        for (count, failed), ids in cancels.items():
            for chunk in _chunks(ids):
                rows = await tx.execute(
                    "UPDATE jobs SET status = 'cancelled', deps_remaining = deps_remaining - ?, "
                    "last_error = ?, finished_at = ?, updated_at = ? "
                    f"WHERE id IN ({_marks(len(chunk))}) AND status = 'waiting' RETURNING id",
                    (count, f"{DEPENDENCY_FAILED}: {failed}", now, now, *chunk),
                )
                cancelled = sorted(str(r[0]) for r in rows)
                out.cancelled += cancelled
                frontier += cancelled
        for count, ids in releases.items():
            for chunk in _chunks(ids):
                # The last edge leaves 'waiting' in the same statement (each SET reads the row as it
                # was: deps_remaining > count means some are left).
                rows = await tx.execute(
                    "UPDATE jobs SET deps_remaining = deps_remaining - ?, "
                    "status = CASE WHEN deps_remaining > ? THEN status "
                    "WHEN run_at > ? THEN 'delayed' ELSE 'ready' END, "
                    "updated_at = CASE WHEN deps_remaining > ? THEN updated_at ELSE ? END "
                    f"WHERE id IN ({_marks(len(chunk))}) AND status = 'waiting' RETURNING id, status",
                    (count, count, now, count, now, *chunk),
                )
                out.promoted += sorted(str(r[0]) for r in rows if r[1] != WAITING)
    return out


async def _resolve_edges(tx: Tx, jobs: list[str]) -> dict[str, tuple[int, str]]:
    """Resolve the open edges on those of ``jobs`` that are finished. Returns, per dependent, how
    many of its edges this resolved and the first that fails it under 'fail' ("" if none)."""
    out: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = defaultdict(int)
    failures: dict[str, str] = {}
    # Every status batch asks this of the jobs it finished, most of which nothing waits for: one
    # array parameter on PostgreSQL, where a list of placeholders costs more to send and plan.
    chunks = [list(jobs)] if tx.supports_array_params else list(_chunks(jobs))
    for chunk in chunks:
        if tx.supports_array_params:
            with_open = await tx.execute(
                "SELECT DISTINCT depends_on_id FROM job_dependencies "
                "WHERE depends_on_id = ANY(?::text[]) AND resolved_state IS NULL",
                (chunk,),
            )
        else:
            with_open = await tx.execute(
                "SELECT DISTINCT depends_on_id FROM job_dependencies "
                f"WHERE depends_on_id IN ({_marks(len(chunk))}) AND resolved_state IS NULL",
                chunk,
            )
        if not with_open:
            continue
        open_ids = sorted(str(r[0]) for r in with_open)
        found: dict[str, tuple[str, Any]] = {}
        for part in _chunks(open_ids):
            rows = await tx.execute(
                f"SELECT id, status, result FROM jobs WHERE id IN ({_marks(len(part))})", part
            )
            found.update((str(r[0]), (str(r[1]), r[2])) for r in rows)
        # A dependency whose row is gone (it cannot be, as dependencies finish and resolve before
        # they may be deleted; the reconciler's sweep makes sure) counts as cancelled: nothing waits
        # forever.
        ended = [
            (dep_id, *found.get(dep_id, ("cancelled", None)))
            for dep_id in open_ids
            if dep_id not in found or found[dep_id][0] in TERMINAL
        ]
        for dep_id, state, result in ended:
            edges = await tx.execute(
                "UPDATE job_dependencies SET resolved_state = ?, result = ? "
                "WHERE depends_on_id = ? AND resolved_state IS NULL RETURNING job_id, on_failure",
                (state, bytes(result) if state == "succeeded" and result is not None else None, dep_id),
            )
            for job_id, on_failure in edges:
                counts[job_id] += 1
                if state != "succeeded" and on_failure == FAIL and job_id not in failures:
                    failures[job_id] = f"job {dep_id} is {state}"
    for job_id, n in counts.items():
        out[job_id] = (n, failures.get(job_id, ""))
    return out


async def stale_waiting(tx: Tx, shard: int, limit: int = 1000) -> list[str]:
    """Jobs whose open edges name a job that finished or no longer exists: their resolution was
    missed (it cannot be by the paths that finish jobs, which resolve in their transaction; this is
    the reconciler's safety net). Returns the dependency ids to resolve."""
    rows = await tx.execute(
        "SELECT DISTINCT d.depends_on_id FROM jobs AS w JOIN job_dependencies AS d ON d.job_id = w.id "
        "WHERE w.shard = ? AND w.status = 'waiting' AND d.resolved_state IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = d.depends_on_id "
        "AND j.status NOT IN ('succeeded', 'cancelled', 'dead')) LIMIT ?",
        (shard, limit),
    )
    return [str(r[0]) for r in rows]


@dataclass(frozen=True)
class EdgeRow:
    job_id: str  # the other job
    type: str  # "" when its row is gone
    status: str  # "" when its row is gone
    on_failure: str
    resolved_state: str


async def graph_of(tx: Tx, job_id: str, limit: int = 1000) -> tuple[list[EdgeRow], list[EdgeRow], int]:
    """A job's dependencies and dependents (with their states) and its count of open dependencies."""
    deps = await tx.execute(
        "SELECT d.depends_on_id, j.type, j.status, d.on_failure, d.resolved_state FROM job_dependencies AS d "
        "LEFT JOIN jobs AS j ON j.id = d.depends_on_id WHERE d.job_id = ? ORDER BY d.depends_on_id LIMIT ?",
        (job_id, limit),
    )
    dependents = await tx.execute(
        "SELECT d.job_id, j.type, j.status, d.on_failure, d.resolved_state FROM job_dependencies AS d "
        "LEFT JOIN jobs AS j ON j.id = d.job_id WHERE d.depends_on_id = ? ORDER BY d.job_id LIMIT ?",
        (job_id, limit),
    )
    remaining = await tx.execute("SELECT deps_remaining FROM jobs WHERE id = ?", (job_id,))
    return (
        [_edge_row(r) for r in deps],
        [_edge_row(r) for r in dependents],
        int(remaining[0][0]) if remaining else 0,
    )


def _edge_row(r: Sequence[Any]) -> EdgeRow:
    return EdgeRow(str(r[0]), r[1] or "", r[2] or "", str(r[3]), r[4] or "")


#: The most result bytes one job's lease carries from its dependencies, in all.
MAX_RESULTS_BYTES = 4 << 20


async def results_of(
    tx: Tx, job_ids: Sequence[str], max_bytes: int = MAX_RESULTS_BYTES
) -> dict[str, list[tuple[str, str, str, bytes, bool]]]:
    """Per job: (dependency id, type, state, result, truncated) of its resolved dependencies, in id
    order. The results come in that order up to ``max_bytes`` in all (per job); every one past
    it is left out (empty, truncated), so a lease stays bounded. The cut is made by the database
    (a running sum of the results' sizes): a result left out is never read, and a job waiting for
    20,000 others costs the dispatcher their ids, not their results. One statement per 500 jobs."""
    out: dict[str, list[tuple[str, str, str, bytes, bool]]] = {job_id: [] for job_id in job_ids}
    for chunk in _chunks(sorted(set(job_ids))):
        rows = await tx.execute(
            "SELECT job_id, depends_on_id, job_type, resolved_state, "
            "CASE WHEN upto <= ? THEN result END, size FROM ("
            "SELECT d.job_id, d.depends_on_id, COALESCE(j.type, '') AS job_type, d.resolved_state, "
            "d.result, COALESCE(length(d.result), 0) AS size, SUM(COALESCE(length(d.result), 0)) "
            "OVER (PARTITION BY d.job_id ORDER BY d.depends_on_id) AS upto "
            "FROM job_dependencies AS d LEFT JOIN jobs AS j ON j.id = d.depends_on_id "
            f"WHERE d.job_id IN ({_marks(len(chunk))}) AND d.resolved_state IS NOT NULL"
            ") AS r ORDER BY job_id, depends_on_id",
            (max_bytes, *chunk),
        )
        for job_id, dep_id, job_type, state, result, size in rows:
            # No result though it had one: it was past the bound.
            cut = result is None and int(size) > 0
            data = bytes(result) if result is not None else b""
            out[job_id].append((str(dep_id), str(job_type), str(state), data, cut))
    return out

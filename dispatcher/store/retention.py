"""Queries of retention: finding finished rows past their age, and deleting them in batches.

Every query goes through the partial index ``jobs_finished`` (type, status, finished_at, id) of
migration 0011: the pruner asks per (type, status), walks from the oldest row and stops at its
cutoff, so a pass costs the rows it deletes, not the table's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Tx

#: The statuses retention deletes. Spelled as in the index's predicate: both databases use a
#: partial index only for a query whose WHERE repeats it.
FINISHED_SQL = "status IN ('succeeded', 'cancelled', 'dead')"
#: Most job types one listing returns (the loose scan takes one index probe per type).
MAX_TYPES = 10_000

_TYPES = (
    "WITH RECURSIVE t(type, n) AS ("
    f" SELECT (SELECT MIN(type) FROM jobs WHERE {FINISHED_SQL}), 1"
    " UNION ALL"
    f" SELECT (SELECT MIN(type) FROM jobs WHERE {FINISHED_SQL} AND type > t.type), t.n + 1"
    " FROM t WHERE t.type IS NOT NULL AND t.n < ?"
    ") SELECT type FROM t WHERE type IS NOT NULL"
)


#: A partition retention retires whole: its id range (hi None: unbounded) and when it starts (ms).
WholeRange = tuple[str, str | None, int]


def _outside(ranges: Sequence[WholeRange]) -> tuple[str, list[object]]:
    """SQL (and its parameters) leaving out the rows of these partitions that finished after their
    partition's range began, which the partition's retirement takes. A row finished before its
    own partition began (its id's time is later than its finish: another host's clock) is left in."""
    sql, params = "", []
    for lo, hi, lo_ms in ranges:
        upper = "" if hi is None else " AND id < ?"
        sql += f"AND NOT (id >= ?{upper} AND finished_at >= ?) "
        params += [lo, *([] if hi is None else [hi]), lo_ms]
    return sql, params


class RetentionQueries:
    """Mixed into Store: every method is one transaction."""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def finished_types(self) -> list[str]:
        """The job types with finished rows (a loose scan of the index: one probe per type)."""
        async with self.transaction() as tx:
            rows = await tx.execute(_TYPES, (MAX_TYPES,))
        return [str(r[0]) for r in rows]

    async def oldest_finished(
        self, job_type: str, status: str, outside: Sequence[WholeRange] = ()
    ) -> int | None:
        """When the type's oldest row in this status finished (ms), None without one; the rows of the
        partitions ``outside`` names do not count (see finished_before)."""
        fence, fence_params = _outside(outside)
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT MIN(finished_at) FROM jobs WHERE {FINISHED_SQL} AND type = ? AND status = ? "
                f"AND finished_at IS NOT NULL {fence}",
                (job_type, status, *fence_params),
            )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    async def finished_before(
        self,
        job_type: str,
        status: str,
        cutoff_ms: int,
        limit: int,
        after: tuple[int, str] | None = None,
        outside: Sequence[WholeRange] = (),
    ) -> list[tuple[str, int]]:
        """Up to ``limit`` (id, finished_at) of the type's rows in this status that finished before
        ``cutoff_ms``, oldest first, after the row ``after`` (its finished_at and id), but for the rows
        of the partitions ``outside`` names that their retirement takes."""
        # A row value: both databases seek the index to it (an OR of the two cases they would filter).
        keyset, params = ("AND (finished_at, id) > (?, ?) ", list(after)) if after is not None else ("", [])
        fence, fence_params = _outside(outside)
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT id, finished_at FROM jobs WHERE {FINISHED_SQL} AND type = ? AND status = ? "
                f"AND finished_at < ? {keyset}{fence}ORDER BY finished_at, id LIMIT ?",
                (job_type, status, cutoff_ms, *params, *fence_params, limit),
            )
        return [(str(r[0]), int(r[1])) for r in rows]

    async def count_finished_before(self, job_type: str, status: str, cutoff_ms: int) -> int:
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT COUNT(*) FROM jobs WHERE {FINISHED_SQL} AND type = ? AND status = ? "
                "AND finished_at < ?",
                (job_type, status, cutoff_ms),
            )
        return int(rows[0][0])

    async def delete_finished(self, ids: Sequence[str], status: str, cutoff_ms: int) -> int:
        """Delete these rows, those still in ``status`` and finished before ``cutoff_ms`` (checked
        again in the statement: a dead job requeued meanwhile is not one of them). Not durable: a
        delete lost in a crash is made again by the next pass. Returns how many were deleted."""
        if not ids:
            return 0
        marks = ", ".join("?" * len(ids))
        async with self.transaction(durable=False) as tx:
            rows = await tx.execute(
                f"DELETE FROM jobs WHERE id IN ({marks}) AND status = ? AND finished_at < ? RETURNING id",
                [*ids, status, cutoff_ms],
            )
            await delete_attempts(tx, [str(r[0]) for r in rows])
        return len(rows)


async def delete_attempts(tx: Tx, ids: Sequence[str]) -> None:
    """Delete the attempt history and dependency edges of these jobs (no foreign key to cascade)."""
    for i in range(0, len(ids), 500):
        chunk = list(ids[i : i + 500])
        await tx.execute(f"DELETE FROM job_attempts WHERE job_id IN ({', '.join('?' * len(chunk))})", chunk)
        # Their edges as waiting jobs (migration 0016); those as dependencies keep the results the
        # jobs that waited read, and go with those jobs.
        await tx.execute(
            f"DELETE FROM job_dependencies WHERE job_id IN ({', '.join('?' * len(chunk))})", chunk
        )

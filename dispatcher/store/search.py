"""The job search (ListJobs, and the bulk actions that take its filter): one WHERE clause built from
a validated JobQuery, pages by keyset on the primary key (job ids are time-ordered), and counts.

Which index serves which condition (migration 0013 and the earlier ones; docs/operations.md has the
query plans): the order and the created-time range use the primary key (the time is the id's
prefix); job types, exact or resolved from patterns and scopes, ``jobs_type_id`` (type, id); the
dead-letter reason ``jobs_dead``; the schedule ``jobs_schedule_id``; the idempotency key
``jobs_idem_key``; finished-time ranges ``jobs_finished``. Error text and payload fields are
conditions checked row by row along one of those; an operator adds an expression index for the
payload fields their searches use (docs/operations.md).

Payloads are bytes. A payload condition holds only for a payload that is a JSON object with that
field and value: any other payload (not UTF-8, not JSON, a JSON array or scalar) never matches, and
never makes the query fail (PostgreSQL: ``shardq_payload_json`` of migration 0013 returns NULL for
it; SQLite: ``json_valid`` guards ``json_extract``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import grpc

from shardq_common.errors import DispatcherError

if TYPE_CHECKING:
    from .base import Tx

#: Most job types the loose scan of ``jobs_type_id`` lists (one index probe per type).
MAX_TYPES = 10_000
#: A query of up to this many job types reads each type's page apart and merges them (JobQuery.page).
MAX_MERGED_TYPES = 64
#: SQLite counts matches up to this many (it has no planner estimate to fall back on).
COUNT_CAP = 10_000
#: PostgreSQL: a search statement that runs longer is cancelled and the caller told to narrow it.
SEARCH_TIMEOUT_MS = 5_000
#: PostgreSQL: an exact count that takes longer gives way to the planner's estimate.
COUNT_TIMEOUT_MS = 100
#: PostgreSQL: the lookup of where the jobs finished since a time start (finished_floor) gives up
#: after this long, and the search walks from the oldest job.
FLOOR_TIMEOUT_MS = 80


class SearchTooSlow(DispatcherError):
    """the search took too long: narrow it (a job type, a state, a time range)"""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass(frozen=True)
class PayloadCondition:
    """``payload.<path> = value``: ``path`` is keys of letters, digits and _ (checked by the caller,
    since they are written into the SQL, where an expression index can match them); ``json`` the
    value as canonical JSON text, ``kind`` its JSON type: number, string, true, false or null."""

    path: tuple[str, ...]
    json: str
    kind: str
    value: Any  # the Python value of a number or string (SQLite compares json_extract's result)


@dataclass(frozen=True)
class JobQuery:
    """A validated search filter. Empty tuples and None are no condition. ``types`` None: any type;
    an empty tuple: no type at all (patterns or a scope that match no known type)."""

    types: tuple[str, ...] | None = None
    statuses: tuple[str, ...] = ()
    priorities: tuple[int, ...] = ()
    min_id: str = ""  # created at or after: the smallest id of that millisecond
    max_id: str = ""  # created before: ids below the smallest of that millisecond
    finished_after_ms: int | None = None
    finished_before_ms: int | None = None
    idem_key: str = ""
    schedule: str = ""
    error_contains: str = ""
    payload: tuple[PayloadCondition, ...] = ()
    dead_reason: str = ""

    def matches_nothing(self) -> bool:
        return self.types is not None and not self.types

    def page(
        self, backend: str, columns: str, limit: int, after_id: str, newest_first: bool
    ) -> tuple[str, list[Any]]:
        """The statement of one page: ``limit`` rows by id after ``after_id`` (keyset). A query of a
        few job types reads each type's rows in id order on its own (``jobs_type_id``, or
        ``jobs_dead`` with a dead reason) and merges them, so each scan stops at the page: the
        single scan of ``type IN (...)`` would read every row of those types and sort them."""
        order = "DESC" if newest_first else "ASC"

        def one(query: JobQuery) -> tuple[str, list[Any]]:
            where, params = query.where(backend)
            if after_id:
                where += " AND id < ?" if newest_first else " AND id > ?"
                params.append(after_id)
            return f"SELECT {columns} FROM jobs WHERE {where} ORDER BY id {order} LIMIT ?", [*params, limit]

        if self.types is None or not 1 < len(self.types) <= MAX_MERGED_TYPES:
            return one(self)
        parts, params = [], []
        for i, job_type in enumerate(self.types):
            sql, values = one(replace(self, types=(job_type,)))
            parts.append(f"SELECT * FROM ({sql}) AS t{i}")
            params += values
        merged = " UNION ALL ".join(parts)
        return f"SELECT * FROM ({merged}) AS merged ORDER BY id {order} LIMIT ?", [*params, limit]

    def where(self, backend: str) -> tuple[str, list[Any]]:
        sql: list[str] = []
        params: list[Any] = []

        def among(column: str, values: Sequence[Any]) -> None:
            if len(values) == 1:
                sql.append(f"{column} = ?")
            else:
                sql.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)

        if self.types:
            among("type", self.types)
        if self.statuses:
            among("status", self.statuses)
        if self.priorities:
            among("priority", self.priorities)
        if self.min_id:
            sql.append("id >= ?")
            params.append(self.min_id)
        if self.max_id:
            sql.append("id < ?")
            params.append(self.max_id)
        if self.finished_after_ms is not None:
            sql.append("finished_at >= ?")
            params.append(self.finished_after_ms)
        if self.finished_before_ms is not None:
            sql.append("finished_at < ?")
            params.append(self.finished_before_ms)
        if self.idem_key:
            sql.append("idem_key = ?")
            params.append(self.idem_key)
        if self.schedule:
            sql.append("schedule = ?")
            params.append(self.schedule)
        if self.dead_reason:
            sql.append("status = 'dead' AND dead_reason = ?")
            params.append(self.dead_reason)
        if self.error_contains:
            if backend == "postgres":  # LIKE, which a trigram index serves (docs/operations.md)
                sql.append("last_error LIKE ?")
                params.append(f"%{_like_escaped(self.error_contains)}%")
            else:  # SQLite's LIKE ignores case
                sql.append("instr(last_error, ?) > 0")
                params.append(self.error_contains)
        for condition in self.payload:
            clause, values = (_pg_payload if backend == "postgres" else _sqlite_payload)(condition)
            sql.append(clause)
            params.extend(values)
        return " AND ".join(sql) or "TRUE", params


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def pg_payload_expression(path: Sequence[str]) -> str:
    """The expression a payload condition compares on PostgreSQL (an expression index on exactly
    this serves it)."""
    return f"(shardq_payload_json(payload) #> '{{{','.join(path)}}}')"


def sqlite_payload_expression(path: Sequence[str]) -> str:
    """The expression a payload condition compares on SQLite (an expression index on exactly this
    serves it): NULL for a payload that is not JSON, where json_extract would raise an error."""
    return (
        "json_extract(CASE WHEN json_valid(CAST(payload AS TEXT)) THEN CAST(payload AS TEXT) END, "
        f"'$.{'.'.join(path)}')"
    )


def _pg_payload(c: PayloadCondition) -> tuple[str, list[Any]]:
    # jsonb equality is typed: 42 = 42.0, but 42 is not "42".
    return f"{pg_payload_expression(c.path)} = ?::jsonb", [c.json]


_SQLITE_KINDS = {"number": "('integer', 'real')", "string": "('text')"}


def _sqlite_payload(c: PayloadCondition) -> tuple[str, list[Any]]:
    value = sqlite_payload_expression(c.path)
    json_type = value.replace("json_extract(", "json_type(", 1)
    if c.kind in _SQLITE_KINDS:
        # json_extract gives 1 for true and the text of a string: the type tells 1 from true and
        # "42" from 42 (SQLite never finds TEXT equal to INTEGER, but 1 = true would hold).
        return f"{value} = ? AND {json_type} IN {_SQLITE_KINDS[c.kind]}", [c.value]
    return f"{json_type} = ?", [c.kind]


class SearchQueries:
    """Mixed into Store: every method is one transaction."""

    backend: str = ""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    def search_transaction(self) -> AbstractAsyncContextManager[Tx]:
        """A transaction for one search statement; PostgreSQL's bounds its time (SEARCH_TIMEOUT_MS)."""
        return self.transaction()

    async def job_types(self) -> list[str]:
        """Every job type with rows (a loose scan of ``jobs_type_id``: one probe per type)."""
        async with self.transaction() as tx:
            rows = await tx.execute(_TYPES, (MAX_TYPES,))
        return [str(r[0]) for r in rows]

    async def finished_floor(self, query: JobQuery) -> str | None:
        """A lower bound of the ids of the jobs that finished at or after ``query.finished_after_ms``
        ("" when it is not known; None when no job did), for a search oldest first: without it the
        walk starts at the oldest job, though the jobs that finished lately were mostly created
        lately. Here: unknown; PostgreSQL looks it up in ``jobs_finished`` within a time bound."""
        return ""

    async def search_ids(
        self, query: JobQuery, limit: int, after_id: str = ""
    ) -> list[tuple[str, int, str, int, str]]:
        """(id, shard, type, priority, status) of up to ``limit`` matching rows after ``after_id``,
        oldest first: what a bulk action needs to act on each."""
        if query.matches_nothing():
            return []
        sql, params = query.page(self.backend, "id, shard, type, priority, status", limit, after_id, False)
        async with self.search_transaction() as tx:
            rows = await tx.execute(sql, params)
        return [(str(r[0]), int(r[1]), str(r[2]), int(r[3]), str(r[4])) for r in rows]

    async def count_jobs(self, query: JobQuery) -> tuple[int, bool]:
        """How many rows match, and whether that is exact. Here: counted up to COUNT_CAP (then
        COUNT_CAP, not exact); PostgreSQL overrides it with a time-bounded count and an estimate."""
        if query.matches_nothing():
            return 0, True
        where, params = query.where(self.backend)
        async with self.search_transaction() as tx:
            rows = await tx.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE {where} LIMIT ?) AS matched",
                [*params, COUNT_CAP + 1],
            )
        n = int(rows[0][0])
        return (COUNT_CAP, False) if n > COUNT_CAP else (n, True)

    # -- the bulk actions' writes ----------------------------------------------------------

    async def due_now(self, ids: Sequence[str], run_at: int) -> int:
        """Run-now's row change: these jobs' run_at, those still delayed (after Redis made them due:
        a reconcile after a Redis data loss then restores them due, not at their old time)."""
        if not ids:
            return 0
        marks = ", ".join("?" * len(ids))
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"UPDATE jobs SET run_at = ? WHERE id IN ({marks}) AND status = 'delayed' RETURNING id",
                [run_at, *ids],
            )
        return len(rows)

    async def delete_finished_rows(self, ids: Sequence[str]) -> int:
        """Delete these rows, those finished (checked again in the statement: a dead job requeued
        meanwhile is not). The caller made sure Redis no longer holds their records."""
        if not ids:
            return 0
        marks = ", ".join("?" * len(ids))
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"DELETE FROM jobs WHERE id IN ({marks}) AND status IN ('succeeded', 'cancelled', 'dead') "
                "RETURNING id",
                list(ids),
            )
        return len(rows)


_TYPES = (
    "WITH RECURSIVE t(type, n) AS ("
    " SELECT (SELECT MIN(type) FROM jobs), 1"
    " UNION ALL"
    " SELECT (SELECT MIN(type) FROM jobs WHERE type > t.type), t.n + 1"
    " FROM t WHERE t.type IS NOT NULL AND t.n < ?"
    ") SELECT type FROM t WHERE type IS NOT NULL"
)

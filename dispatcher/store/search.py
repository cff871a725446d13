"""The job search (ListJobs, and the bulk actions that take its filter): one WHERE clause built from
a validated JobQuery, pages by keyset on the primary key (job ids are time-ordered), and counts.
A search with a finished-time range pages in the order the jobs finished instead (finished_at, then
id): in id order its first page could mean walking past every job created before the first one
that finished in the range (a job delayed for a week, then run).

Which index serves which condition (migrations 0013, 0019 and the earlier ones; docs/operations.md
has the query plans): the order and the created-time range use the primary key (the time is the
id's prefix); job types, exact or resolved from patterns and scopes, ``jobs_type_id`` (type, id);
the dead-letter reason ``jobs_dead`` with types, ``jobs_dead_reason`` without; the schedule
``jobs_schedule_id``; the idempotency key ``jobs_idem_key`` with a type, ``job_idem_keys_key``
(PostgreSQL) or ``jobs_idem_key_alone`` (SQLite) without; finished-time ranges ``jobs_finished``
for a few types, ``jobs_finished_at`` otherwise. Error text and payload fields are conditions
checked row by row along one of those; an operator adds an expression index for the payload fields
their searches use (docs/operations.md).

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
#: A search in finish-time order reads type by type while its types x finished states are this few.
MAX_FINISHED_RANGES = 12
#: The states a job has a finish time in (finished_at is set with them and cleared on a requeue).
FINISHED_STATES = ("succeeded", "cancelled", "dead")


#: Where the previous page ended: its last job's id, or in finish-time order (finished_at, id); ""
#: before the first page.
SearchPosition = str | tuple[int, str]


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

    @property
    def in_finished_order(self) -> bool:
        """Whether its pages go by finish time (a finished-time range) rather than by id."""
        return self.finished_after_ms is not None or self.finished_before_ms is not None

    def page_statement(
        self, backend: str, columns: str, limit: int, after: SearchPosition, newest_first: bool
    ) -> tuple[str, list[Any]]:
        """The statement of one page in the search's order: by finish time with a finished-time
        range (``finished_page``), else by id (``page``). ``columns`` must hold finished_at for the
        first."""
        if self.in_finished_order:
            position = after if isinstance(after, tuple) else None
            return self.finished_page(backend, columns, limit, position, newest_first)
        return self.page(backend, columns, limit, after if isinstance(after, str) else after[1], newest_first)

    def finished_page(
        self, backend: str, columns: str, limit: int, after: tuple[int, str] | None, newest_first: bool
    ) -> tuple[str, list[Any]]:
        """The statement of one page in finish-time order, after ``after`` (finished_at, id). A few
        types (types x finished states up to MAX_FINISHED_RANGES) read one range of ``jobs_finished``
        (type, status, finished_at, id) each, merged, each stopping at the page: exact however rare
        the types. Any other search walks ``jobs_finished_at`` (finished_at, id) once, checking the
        rest of the filter on each row: one range per partition, where a range per type, state and
        partition would cost more than the walk (docs/performance.md)."""
        order = "DESC" if newest_first else "ASC"
        states = tuple(s for s in FINISHED_STATES if not self.statuses or s in self.statuses)
        if not states:
            return f"SELECT {columns} FROM jobs WHERE FALSE", []
        if self.types is not None and len(self.types) * len(states) <= MAX_FINISHED_RANGES:
            slices = [replace(self, types=(t,), statuses=(s,)) for t in self.types for s in states]
        else:
            slices = [replace(self, statuses=states)]
        parts, params = [], []
        for query in slices:
            where, values = query.where(backend)
            if after is not None:
                where += (
                    " AND (finished_at, id) < (?, ?)" if newest_first else " AND (finished_at, id) > (?, ?)"
                )
                values += list(after)
            parts.append(
                f"SELECT {columns} FROM jobs WHERE {where} ORDER BY finished_at {order}, id {order} LIMIT ?"
            )
            params += [*values, limit]
        if len(parts) == 1:
            return parts[0], params
        merged = " UNION ALL ".join(f"SELECT * FROM ({part}) AS p{i}" for i, part in enumerate(parts))
        return f"SELECT * FROM ({merged}) AS merged ORDER BY finished_at {order}, id {order} LIMIT ?", [
            *params,
            limit,
        ]

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
            # PostgreSQL's jobs table is partitioned (migration 0014): the keys' index is job_idem_keys.
            sql.append(
                "id IN (SELECT job_id FROM job_idem_keys WHERE idem_key = ?)"
                if backend == "postgres"
                else "idem_key = ?"
            )
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

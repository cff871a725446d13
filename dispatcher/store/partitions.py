"""Time partitions of the jobs table (PostgreSQL, migration 0014): created ahead, retired whole.

``jobs`` is partitioned by RANGE of its id. An id starts with 10 characters of its creation time
(dispatcher/queue/ids.py), so a partition ``jobs_p20261205t0000`` holding the ids from the prefix
of 2026-12-05 00:00 UTC to the prefix of the next boundary holds the jobs created in that interval.
Besides those: ``jobs_default``, the DEFAULT partition, which takes an id no partition covers (a
range not created yet or already retired), and ``jobs_legacy``, the table as it was before the
migration, covering every id before the migration's next midnight.

Retiring a partition (once every finished row in it is past its period): its survivors (rows not
finished, rows whose period has not passed, rows Redis still holds) are copied into a new table of
the same range, ``<name>_kept``, while the partition stays in use; a row trigger notes the ids that
change meanwhile. Then, in one short transaction, the partition is detached, the noted rows are
copied again, the kept table is attached in its place (its indexes built and its bound proved by a
CHECK beforehand, so the attach reads nothing) and the partition is dropped: no DELETE, so no dead
tuples, no vacuum and only the kept rows' WAL. A partition left with too many survivors to be
worth a copy is renamed ``_kept`` instead; kept partitions belong to the row-by-row pruner and are
dropped once nothing in them survives.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .retention import FINISHED_SQL

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

PARENT = "jobs"
DEFAULT = "jobs_default"
LEGACY = "jobs_legacy"
PREFIX = "jobs_p"
KEPT = "_kept"
#: The rows a partition's retirement notes as changed while its survivors are copied.
CHANGES = "_changes"
#: The dead rows a retirement drops, listed beside the hot path for the dead counts.
GONE = "_gone"
ACTIVE_SQL = "status IN ('delayed', 'ready', 'leased')"
# pg_try_advisory_lock key of the partition keeper, one per database: b"shardq:p" as an int64.
KEEPER_LOCK_KEY = int.from_bytes(b"shardq:p", "big", signed=True)
#: How long DDL on jobs waits for its lock before giving up until the next pass: the hot path's
#: statements queue behind a waiting ACCESS EXCLUSIVE request, so it must not wait long.
LOCK_TIMEOUT = "2s"

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'[^']*')\) TO \((MAXVALUE|'[^']*')\)")


def id_prefix(ms: int) -> str:
    """The first 10 characters of the ids made at ``ms`` (as dispatcher/queue/ids.py makes them)."""
    return "".join(_ALPHABET[(ms >> (5 * i)) & 31] for i in range(9, -1, -1))


def prefix_ms(prefix: str) -> int:
    """The milliseconds a 10-character id prefix starts at."""
    value = 0
    for ch in prefix[:10]:
        value = value * 32 + _ALPHABET.index(ch)
    return value


def partition_name(start_ms: int) -> str:
    return PREFIX + datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y%m%dt%H%M")


@dataclass(frozen=True)
class Partition:
    name: str
    #: The bounds as id prefixes; None: MINVALUE / MAXVALUE.
    lo: str | None
    hi: str | None
    default: bool = False

    @property
    def kept(self) -> bool:
        """Survivors of a retirement (or a partition left to the row-by-row pruner)."""
        return self.name.endswith(KEPT)

    @property
    def fresh(self) -> bool:
        """A partition retention retires whole (the row pruner leaves its rows alone)."""
        return not self.default and not self.kept

    @property
    def lo_ms(self) -> int | None:
        return None if self.lo is None else _ms_or_none(self.lo)

    @property
    def hi_ms(self) -> int | None:
        return None if self.hi is None else _ms_or_none(self.hi)


def _ms_or_none(prefix: str) -> int | None:
    try:
        return prefix_ms(prefix)
    except ValueError:  # a bound that is no id prefix (set by hand)
        return None


@dataclass(frozen=True)
class Cutoffs:
    """Rows that finished before these times (ms) are past their retention: per job type, and the
    default for the types not listed."""

    finished_ms: int
    dead_ms: int
    by_type: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def of(self, job_type: str, status: str) -> int:
        finished, dead = self.by_type.get(job_type, (self.finished_ms, self.dead_ms))
        return dead if status == "dead" else finished

    def params(self) -> list[Any]:
        """For _DELETABLE: the per-type arrays, then the defaults."""
        types = sorted(self.by_type)
        return [
            types,
            [self.by_type[t][0] for t in types],
            [self.by_type[t][1] for t in types],
            self.finished_ms,
            self.dead_ms,
        ]


# A row of the partition (alias j) that retention may delete: finished before its type's cutoff. The
# per-type cutoffs join as arrays; a type without its own takes the defaults.
_CUTOFFS = (
    "LEFT JOIN unnest(%s::text[], %s::bigint[], %s::bigint[]) AS c(type, finished_ms, dead_ms) "
    "ON c.type = j.type"
)
_DELETABLE = (
    "(j.finished_at IS NOT NULL AND ("
    "(j.status IN ('succeeded', 'cancelled') AND j.finished_at < coalesce(c.finished_ms, %s)) OR "
    "(j.status = 'dead' AND j.finished_at < coalesce(c.dead_ms, %s))))"
)


@dataclass
class Retirement:
    """What retire_partition did."""

    outcome: str  # dropped | compacted | kept | skipped
    survivors: int = 0
    rows: int = 0
    detail: str = ""


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


class PartitionQueries:
    """Mixed into PostgresStore."""

    pool: AsyncConnectionPool[Any]

    @asynccontextmanager
    async def _keeper(self) -> AsyncIterator[psycopg.AsyncConnection[Any] | None]:
        """A connection holding the keeper's session lock, or None when another process holds it:
        one process at a time creates and retires partitions."""
        async with self.pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                row = await (
                    await conn.execute("SELECT pg_try_advisory_lock(%s)", (KEEPER_LOCK_KEY,))
                ).fetchone()
                if not row or not row[0]:
                    yield None
                    return
                try:
                    yield conn
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (KEEPER_LOCK_KEY,))
            finally:
                await conn.set_autocommit(False)

    async def partitions(self) -> list[Partition]:
        async with self.pool.connection() as conn:
            return await _partitions(conn)

    # -- created ahead ---------------------------------------------------------------

    async def ensure_partitions(self, from_ms: int, until_ms: int, interval_ms: int) -> list[str] | None:
        """Create the partitions of the intervals from the one holding ``from_ms`` to the one holding
        ``until_ms``, where no partition covers them yet (a range partly covered, say after the
        interval changed, gets the uncovered part). Rows the default partition holds in a new range
        move into it. Returns the names created; None when another process is at it."""
        async with self._keeper() as conn:
            if conn is None:
                return None
            created = []
            start = from_ms - from_ms % interval_ms
            while start <= until_ms:
                for lo, hi in _gaps(await _partitions(conn), start, start + interval_ms):
                    created.append(await _create(conn, lo, hi))
                start += interval_ms
            return created

    # -- retired ---------------------------------------------------------------------

    async def newest_finished(self, partition: Partition) -> dict[tuple[str, str], int]:
        """(type, status) -> the latest finished_at among the partition's finished rows: one probe
        of its ``jobs_finished`` index per type and status."""
        table = _ident(partition.name)
        out: dict[tuple[str, str], int] = {}
        async with self.pool.connection() as conn:
            types_query = sql.SQL(
                "WITH RECURSIVE t(type) AS ("
                " SELECT (SELECT MIN(type) FROM {t} WHERE " + FINISHED_SQL + ")"
                " UNION ALL"
                " SELECT (SELECT MIN(type) FROM {t} WHERE " + FINISHED_SQL + " AND type > t.type)"
                " FROM t WHERE t.type IS NOT NULL"
                ") SELECT type FROM t WHERE type IS NOT NULL"
            ).format(t=table)
            types = [r[0] for r in await (await conn.execute(types_query)).fetchall()]
            for job_type in types:
                for status in ("succeeded", "cancelled", "dead"):
                    row = await (
                        await conn.execute(
                            sql.SQL(
                                "SELECT MAX(finished_at) FROM {t} WHERE " + FINISHED_SQL + " AND type = %s "
                                "AND status = %s"
                            ).format(t=table),
                            (job_type, status),
                        )
                    ).fetchone()
                    if row and row[0] is not None:
                        out[(job_type, status)] = int(row[0])
        return out

    async def retire_partition(
        self,
        partition: Partition,
        cutoffs: Cutoffs,
        held: Sequence[str],
        *,
        max_share: float,
        before_swap: Callable[[], Awaitable[None]] | None = None,
    ) -> Retirement:
        """Retire a partition whose rows retention may delete, keeping its survivors (see the
        module's docstring): rows not finished, finished after their cutoff, or in ``held`` (their
        records still in Redis). More survivors than ``max_share`` of its rows: the partition is
        kept whole (renamed), for the row-by-row pruner. A kept partition is dropped only when
        nothing in it survives. ``before_swap`` runs between the copy and the swap (tests change
        rows there)."""
        async with self._keeper() as conn:
            if conn is None:
                return Retirement("skipped", detail="another process keeps the partitions")
            return await _retire(conn, partition, cutoffs, list(held), max_share, before_swap)

    async def sweep_orphans(self, lo: str | None, hi: str | None, batch: int = 1000) -> int:
        """Delete the idempotency keys (and attempt rows and dependency edges as the waiting job, when
        those tables exist) of ids in [lo, hi) whose job row is gone: what a retired partition's rows
        leave behind. In batches.
        An orphan key left by a crash is harmless meanwhile: the next job with that key takes it."""
        total = 0
        async with self.pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                for table in ("job_idem_keys", "job_attempts", "job_dependencies"):
                    if await _scalar(conn, "SELECT to_regclass(%s) IS NOT NULL", (table,)):
                        total += await _sweep(conn, table, lo, hi, batch)
            finally:
                await conn.set_autocommit(False)
        return total

    # -- sizes -----------------------------------------------------------------------

    async def table_bytes(self) -> dict[str, int]:
        """Bytes on disk, indexes and TOAST included, of jobs (every partition), job_idem_keys and
        job_attempts (when it exists)."""
        async with self.pool.connection() as conn:
            rows = await (
                await conn.execute(
                    "SELECT t.name, coalesce((SELECT sum(pg_total_relation_size(p.relid))"
                    " FROM pg_partition_tree(to_regclass(t.name)) AS p), 0)::bigint"
                    " + pg_total_relation_size(to_regclass(t.name))"
                    " FROM unnest(ARRAY['jobs', 'job_idem_keys', 'job_attempts']) AS t(name)"
                    " WHERE to_regclass(t.name) IS NOT NULL"
                )
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}


async def _partitions(conn: psycopg.AsyncConnection[Any]) -> list[Partition]:
    rows = await (
        await conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i "
            "JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            (PARENT,),
        )
    ).fetchall()
    out = []
    for name, bound in rows:
        if bound == "DEFAULT":
            out.append(Partition(name, None, None, default=True))
            continue
        m = _BOUND.search(bound or "")
        if m is None:
            continue
        lo, hi = (None if v in ("MINVALUE", "MAXVALUE") else v.strip("'") for v in m.groups())
        out.append(Partition(name, lo, hi))
    return sorted(out, key=lambda p: (p.default, p.lo or ""))


def _gaps(existing: list[Partition], start_ms: int, end_ms: int) -> list[tuple[str, str]]:
    """The parts of [start, end) no partition covers, as id prefixes."""
    lo, hi = id_prefix(start_ms), id_prefix(end_ms)
    pieces = [(lo, hi)]
    for p in existing:
        if p.default:
            continue
        p_lo, p_hi = p.lo or "", p.hi
        next_pieces = []
        for a, b in pieces:
            if p_hi is not None and p_hi <= a or p_lo >= b:
                next_pieces.append((a, b))
                continue
            if p_lo > a:
                next_pieces.append((a, p_lo))
            if p_hi is not None and p_hi < b:
                next_pieces.append((p_hi, b))
        pieces = next_pieces
    return [(a, b) for a, b in pieces if a < b]


async def _create(conn: psycopg.AsyncConnection[Any], lo: str, hi: str) -> str:
    name = partition_name(prefix_ms(lo))
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        strays = await (
            await conn.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {d} WHERE id >= %s AND id < %s)").format(
                    d=_ident(DEFAULT)
                ),
                (lo, hi),
            )
        ).fetchone()
        bounds = {"lo": sql.Literal(lo), "hi": sql.Literal(hi)}
        if not (strays and strays[0]):
            await conn.execute(
                sql.SQL("CREATE TABLE {p} PARTITION OF {t} FOR VALUES FROM ({lo}) TO ({hi})").format(
                    p=_ident(name), t=_ident(PARENT), **bounds
                )
            )
            return name
        # Rows the default partition took for this range (no partition covered it): they move into
        # the new one, which is then attached (the default's rows outside it are not read again).
        # Moved directly between the partitions, the triggers of jobs do not fire: the dead counts
        # and the idempotency keys stay as they are.
        await conn.execute(
            sql.SQL("CREATE TABLE {p} (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                p=_ident(name), t=_ident(PARENT)
            )
        )
        await conn.execute(
            sql.SQL(
                "WITH moved AS (DELETE FROM {d} WHERE id >= %s AND id < %s RETURNING *) "
                "INSERT INTO {p} SELECT * FROM moved"
            ).format(d=_ident(DEFAULT), p=_ident(name)),
            (lo, hi),
        )
        await conn.execute(
            sql.SQL("ALTER TABLE {t} ATTACH PARTITION {p} FOR VALUES FROM ({lo}) TO ({hi})").format(
                t=_ident(PARENT), p=_ident(name), **bounds
            )
        )
    return name


async def _sweep(
    conn: psycopg.AsyncConnection[Any], table: str, lo: str | None, hi: str | None, batch: int
) -> int:
    """Delete ``table``'s rows of ids in [lo, hi) whose job is gone, ``batch`` at a time."""
    total, after = 0, lo or ""
    bound, bound_params = ("AND x.job_id < %s ", [hi]) if hi is not None else ("", [])
    query = sql.SQL(
        "WITH batch AS (SELECT x.job_id FROM {t} AS x WHERE x.job_id >= %s "
        + bound
        + "AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = x.job_id) ORDER BY x.job_id LIMIT %s), "
        "gone AS (DELETE FROM {t} AS x USING batch WHERE x.job_id = batch.job_id RETURNING x.job_id) "
        "SELECT count(*), max(job_id) FROM gone"
    ).format(t=_ident(table))
    while True:
        async with conn.transaction():
            await conn.execute("SET LOCAL synchronous_commit = off")
            row = await (await conn.execute(query, [after, *bound_params, batch])).fetchone()
        n = int(row[0]) if row else 0
        total += n
        if n < batch or row is None or row[1] is None:
            return total
        after = row[1]


async def _scalar(conn: psycopg.AsyncConnection[Any], query: Any, params: Sequence[Any] = ()) -> Any:
    row = await (await conn.execute(query, params)).fetchone()
    return row[0] if row else None


async def _retire(
    conn: psycopg.AsyncConnection[Any],
    p: Partition,
    cutoffs: Cutoffs,
    held: list[str],
    max_share: float,
    before_swap: Callable[[], Awaitable[None]] | None,
) -> Retirement:
    part, kept, changes = _ident(p.name), _ident(_kept_name(p.name)), _ident(p.name + CHANGES)
    gone = _ident(p.name + GONE)
    trigger = _ident(f"{p.name}_retiring")
    survivor_where = sql.SQL("NOT " + _DELETABLE + " OR j.id = ANY(%s)")
    survivor_params = [*cutoffs.params()[3:], held]
    # A previous attempt cut short left these behind.
    await conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {g} ON {p}").format(g=trigger, p=part))
    if not p.kept:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {k}").format(k=kept))
    await conn.execute(sql.SQL("DROP TABLE IF EXISTS {c}, {g}").format(c=changes, g=gone))

    counted = await (
        await conn.execute(
            sql.SQL("SELECT count(*), count(*) FILTER (WHERE ").format()
            + survivor_where
            + sql.SQL(") FROM {p} AS j " + _CUTOFFS).format(p=part),
            [*survivor_params, *cutoffs.params()[:3]],
        )
    ).fetchone()
    rows, survivors = (int(counted[0]), int(counted[1])) if counted else (0, 0)
    if p.kept and survivors:
        return Retirement("skipped", survivors, rows, "kept partition with survivors: the row pruner's")
    if survivors and (p.kept or survivors > max_share * max(rows, 1)):
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            await conn.execute(sql.SQL("ALTER TABLE {p} RENAME TO {k}").format(p=part, k=kept))
        return Retirement("kept", survivors, rows)

    # Phase 1, beside the hot path: note every change from now on, then copy the survivors.
    await conn.execute(sql.SQL("CREATE UNLOGGED TABLE {c} (id text)").format(c=changes))
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute(
            sql.SQL(
                "CREATE TRIGGER {g} AFTER INSERT OR UPDATE OR DELETE ON {p} "
                "FOR EACH ROW EXECUTE FUNCTION shardq_note_retiring_change({c})"
            ).format(g=trigger, p=part, c=sql.Literal(p.name + CHANGES))
        )
    if survivors:
        await conn.execute(
            sql.SQL("CREATE TABLE {k} (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                k=kept, t=_ident(PARENT)
            )
        )
        await conn.execute(
            sql.SQL("INSERT INTO {k} SELECT j.* FROM {p} AS j " + _CUTOFFS + " WHERE ").format(k=kept, p=part)
            + survivor_where,
            [*cutoffs.params()[:3], *survivor_params],
        )
        # The bound, proved once here, spares the attach a read; the parent's indexes, built here,
        # are adopted by the attach instead of being built under its lock.
        bound = [f"id >= {_literal(p.lo)}" if p.lo else None, f"id < {_literal(p.hi)}" if p.hi else None]
        await conn.execute(
            sql.SQL("ALTER TABLE {k} ADD CHECK (" + " AND ".join(b for b in bound if b) + ")").format(k=kept)
        )
        for definition in await _index_definitions(conn):
            await conn.execute(_on_table(definition, _kept_name(p.name)).encode())

    # The dead rows that go, for the dead counts (the triggers that keep them do not see a DROP).
    await conn.execute(
        sql.SQL(
            "CREATE UNLOGGED TABLE {g} AS SELECT j.id, j.type, j.priority FROM {p} AS j "
            + _CUTOFFS
            + " WHERE j.status = 'dead' AND NOT ("
        ).format(g=gone, p=part)
        + survivor_where
        + sql.SQL(")"),
        [*cutoffs.params()[:3], *survivor_params],
    )

    if before_swap is not None:
        await before_swap()
    # Phase 2, one short transaction: the noted rows again, and the swap.
    try:
        changed = await _swap(conn, p, survivors)
    except _Retry:
        await conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {g} ON {p}").format(g=trigger, p=part))
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {c}, {g}").format(c=changes, g=gone))
        return Retirement("skipped", survivors, rows, "rows changed during the retirement")
    kept_rows = survivors + len(changed)
    return Retirement("compacted" if kept_rows else "dropped", survivors, rows)


class _Retry(Exception):
    pass


async def _swap(conn: psycopg.AsyncConnection[Any], p: Partition, survivors: int) -> list[str]:
    part, kept, changes = _ident(p.name), _ident(_kept_name(p.name)), _ident(p.name + CHANGES)
    gone = _ident(p.name + GONE)
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute(sql.SQL("ALTER TABLE {t} DETACH PARTITION {p}").format(t=_ident(PARENT), p=part))
        changed = [
            r[0]
            for r in await (
                await conn.execute(sql.SQL("SELECT DISTINCT id FROM {c}").format(c=changes))
            ).fetchall()
        ]
        if changed and p.kept:
            raise _Retry  # a kept partition's rows changed meanwhile: not this time
        if changed and not survivors:
            await conn.execute(
                sql.SQL("CREATE TABLE {k} (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                    k=kept, t=_ident(PARENT)
                )
            )
        if changed:
            # A row that changed during the copy is kept in its last version, whatever it is now.
            await conn.execute(sql.SQL("DELETE FROM {k} WHERE id = ANY(%s)").format(k=kept), (changed,))
            await conn.execute(
                sql.SQL("INSERT INTO {k} SELECT * FROM {p} WHERE id = ANY(%s)").format(k=kept, p=part),
                (changed,),
            )
        # The dead rows that go; one that changed meanwhile was counted by its own change (a
        # requeue, a purge) and is kept in its last version.
        await conn.execute(
            sql.SQL(
                "UPDATE dead_counts SET n = dead_counts.n - d.n FROM ("
                " SELECT g.type, g.priority, count(*) AS n FROM {g} AS g WHERE NOT (g.id = ANY(%s))"
                " GROUP BY g.type, g.priority) AS d "
                "WHERE dead_counts.type = d.type AND dead_counts.priority = d.priority"
            ).format(g=gone),
            (changed,),
        )
        if survivors or changed:
            await conn.execute(
                sql.SQL("ALTER TABLE {t} ATTACH PARTITION {k} FOR VALUES FROM ({lo}) TO ({hi})").format(
                    t=_ident(PARENT),
                    k=kept,
                    lo=sql.Literal(p.lo) if p.lo else sql.SQL("MINVALUE"),
                    hi=sql.Literal(p.hi) if p.hi else sql.SQL("MAXVALUE"),
                )
            )
        await conn.execute(sql.SQL("DROP TABLE {p}, {c}, {g}").format(p=part, c=changes, g=gone))
    return changed


def _kept_name(name: str) -> str:
    return name if name.endswith(KEPT) else name + KEPT


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _index_definitions(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    rows = await (
        await conn.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = to_regclass(%s)", (PARENT,)
        )
    ).fetchall()
    return [str(r[0]) for r in rows]


_INDEX_DEF = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON ONLY \S+ ")


def _on_table(definition: str, table: str) -> str:
    """A partitioned index's definition, for a table about to become a partition (a name of its own)."""
    m = _INDEX_DEF.match(definition)
    if m is None:
        raise ValueError(f"unexpected index definition: {definition}")
    return f"CREATE {m.group(1) or ''}INDEX ON {sql_quote(table)} " + definition[m.end() :]


def sql_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'

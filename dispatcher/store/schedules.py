"""Schedule rows, and the one transaction that turns occurrences into jobs."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from shardq_common.clock import wall_ms

if TYPE_CHECKING:
    from .base import JobRow, Tx

SPEC_FIELDS = (
    "cron",
    "timezone",
    "type",
    "shard",
    "payload",
    "priority",
    "max_attempts",
    "lease_ttl_ms",
    "max_lag_ms",
    "catch_up",
)


@dataclass(frozen=True)
class ScheduleRow:
    name: str
    cron: str
    timezone: str
    type: str
    shard: int
    payload: bytes
    priority: int
    max_attempts: int
    lease_ttl_ms: int
    max_lag_ms: int
    catch_up: str
    enabled: bool
    deleted: bool = False
    version: int = 1
    changed_at: int = 0
    cleanup_pending: bool = False
    cursor_ms: int = 0
    last_occurrence_ms: int | None = None
    next_occurrence_ms: int | None = None
    materialized: int = 0
    skipped: int = 0
    created_at: int = 0
    updated_at: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ScheduleRow:
        values = dict(zip(_NAMES, row, strict=True))
        values["payload"] = bytes(values["payload"])
        for flag in ("enabled", "deleted", "cleanup_pending"):
            values[flag] = bool(values[flag])
        return cls(**values)

    def same_spec(self, other: ScheduleRow) -> bool:
        return all(getattr(self, f) == getattr(other, f) for f in SPEC_FIELDS)


_NAMES = tuple(f.name for f in fields(ScheduleRow))
_COLUMNS = ", ".join(_NAMES)
_MARKS = ", ".join("?" * len(_NAMES))


@dataclass(frozen=True)
class Advance:
    """What one tick did to a schedule: it moves the cursor, so it commits only over the cursor the
    tick started from (a racing tick or a change in between makes it a no-op)."""

    name: str
    version: int
    from_cursor: int
    to_cursor: int
    last_occurrence_ms: int | None
    next_occurrence_ms: int | None
    skipped: int


@dataclass(frozen=True)
class StaleOccurrence:
    """A not-yet-finished job of an older version of a schedule, due after the change."""

    id: str
    shard: int
    type: str
    priority: int
    run_at: int
    status: str


class ScheduleQueries:
    """Mixed into Store: every method is one transaction."""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def upsert_schedule(
        self, wanted: ScheduleRow, enabled: bool | None
    ) -> tuple[ScheduleRow, bool, bool]:
        """Create the schedule, or change the existing one of that name. Returns (row, created,
        changed); an existing schedule exactly like `wanted` is left alone. A change starts a new
        version at this moment: occurrences are computed afresh from now, and the owner cancels
        those the older version materialized for later. A schedule created again after one of that
        name was deleted continues after its retired version: its occurrences' job ids (from name,
        version and time) must not be those of the deleted one's jobs. The retired version goes once
        retention deleted the last of those jobs (store/leftovers.py); the name starts at 1 again."""
        now = wall_ms()
        async with self.transaction() as tx:
            current = await _select(tx, wanted.name, for_update=True)
            if current is None:
                retired = await tx.execute(
                    "SELECT version FROM retired_schedule_versions WHERE name = ?", (wanted.name,)
                )
                row = replace(
                    wanted,
                    enabled=True if enabled is None else enabled,
                    version=retired[0][0] + 1 if retired else 1,
                    changed_at=now,
                    cursor_ms=now,
                    created_at=now,
                    updated_at=now,
                )
                await tx.execute(f"INSERT INTO schedules ({_COLUMNS}) VALUES ({_MARKS})", _values(row))
                return row, True, False
            want_enabled = current.enabled if enabled is None else enabled
            if not current.deleted and current.same_spec(wanted) and current.enabled == want_enabled:
                return current, False, False
            row = replace(
                current,
                **{f: getattr(wanted, f) for f in SPEC_FIELDS},
                enabled=want_enabled,
                deleted=False,
                created_at=now if current.deleted else current.created_at,
            )
            row = _new_version(row, now)
            await _update(tx, row)
            return row, current.deleted, True

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleRow | None:
        now = wall_ms()
        async with self.transaction() as tx:
            current = await _select(tx, name, for_update=True)
            if current is None or current.deleted:
                return None
            if current.enabled == enabled:
                return current
            row = _new_version(replace(current, enabled=enabled), now)
            await _update(tx, row)
            return row

    async def delete_schedule(self, name: str) -> bool:
        """Mark it deleted; its owner cancels its future occurrences, then removes the row."""
        now = wall_ms()
        async with self.transaction() as tx:
            current = await _select(tx, name, for_update=True)
            if current is None or current.deleted:
                return False
            await _update(tx, _new_version(replace(current, enabled=False, deleted=True), now))
            return True

    async def get_schedule(self, name: str) -> ScheduleRow | None:
        async with self.transaction() as tx:
            row = await _select(tx, name)
        return None if row is None or row.deleted else row

    async def list_schedules(self, job_type: str = "") -> list[ScheduleRow]:
        sql = f"SELECT {_COLUMNS} FROM schedules WHERE NOT deleted"
        params: list[Any] = []
        if job_type:
            sql += " AND type = ?"
            params.append(job_type)
        async with self.transaction() as tx:
            rows = await tx.execute(sql + " ORDER BY name", params)
        return [ScheduleRow.from_row(r) for r in rows]

    async def due_schedules(self, shards: Sequence[int], until_ms: int, limit: int) -> list[ScheduleRow]:
        """Enabled schedules of these shards with an occurrence at or before `until_ms`."""
        if not shards:
            return []
        marks = ", ".join("?" * len(shards))
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE shard IN ({marks}) AND enabled AND NOT deleted "
                "AND NOT cleanup_pending AND next_occurrence_ms IS NOT NULL AND next_occurrence_ms <= ? "
                "ORDER BY next_occurrence_ms LIMIT ?",
                [*shards, until_ms, limit],
            )
        return [ScheduleRow.from_row(r) for r in rows]

    async def schedules_to_clean(self, shards: Sequence[int]) -> list[ScheduleRow]:
        if not shards:
            return []
        marks = ", ".join("?" * len(shards))
        async with self.transaction() as tx:
            rows = await tx.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE shard IN ({marks}) AND cleanup_pending", list(shards)
            )
        return [ScheduleRow.from_row(r) for r in rows]

    async def stale_occurrences(self, schedule: ScheduleRow) -> list[StaleOccurrence]:
        """Jobs of the schedule's older versions due after its last change and not finished."""
        async with self.transaction() as tx:
            rows = await tx.execute(
                "SELECT id, shard, type, priority, run_at, status FROM jobs WHERE schedule = ? "
                "AND schedule_version < ? AND run_at > ? AND status IN ('delayed', 'ready', 'leased')",
                (schedule.name, schedule.version, schedule.changed_at),
            )
        return [StaleOccurrence(*r) for r in rows]

    async def finish_cleanup(self, schedule: ScheduleRow, cursor_floor: int, next_ms: int | None) -> None:
        """The older versions' future occurrences are cancelled (or were already running: the new
        version starts after the last of those, `cursor_floor`, so no occurrence runs twice)."""
        async with self.transaction() as tx:
            if schedule.deleted:
                removed = await tx.execute(
                    "DELETE FROM schedules WHERE name = ? AND version = ? AND deleted RETURNING name",
                    (schedule.name, schedule.version),
                )
                if removed:
                    await tx.execute(
                        "INSERT INTO retired_schedule_versions (name, version, retired_at) VALUES (?, ?, ?) "
                        "ON CONFLICT (name) DO UPDATE SET version = excluded.version, "
                        "retired_at = excluded.retired_at",
                        (schedule.name, schedule.version, wall_ms()),
                    )
                return
            await tx.execute(
                "UPDATE schedules SET cleanup_pending = FALSE, next_occurrence_ms = ?, "
                "cursor_ms = CASE WHEN cursor_ms < ? THEN ? ELSE cursor_ms END "
                "WHERE name = ? AND version = ?",
                (next_ms, cursor_floor, cursor_floor, schedule.name, schedule.version),
            )

    async def materialize(self, advance: Advance, rows: Sequence[JobRow], version: int) -> list[str] | None:
        """Move the cursor and insert the occurrences' jobs, all or nothing. Returns the ids inserted
        (an id that exists is not inserted again), or None when the schedule moved on meanwhile."""
        now = wall_ms()
        async with self.transaction() as tx:
            moved = await tx.execute(
                "UPDATE schedules SET cursor_ms = ?, last_occurrence_ms = COALESCE(?, last_occurrence_ms), "
                "next_occurrence_ms = ?, materialized = materialized + ?, skipped = skipped + ?, "
                "updated_at = ? "
                "WHERE name = ? AND version = ? AND cursor_ms = ? AND enabled AND NOT deleted RETURNING name",
                (
                    advance.to_cursor,
                    advance.last_occurrence_ms,
                    advance.next_occurrence_ms,
                    len(rows),
                    advance.skipped,
                    now,
                    advance.name,
                    advance.version,
                    advance.from_cursor,
                ),
            )
            if not moved:
                return None
            created = []
            for r in rows:
                got = await tx.execute(
                    "INSERT INTO jobs (id, type, shard, priority, payload, status, run_at, max_attempts, "
                    "lease_ttl_ms, enqueued_at, updated_at, schedule, schedule_version) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
                    (
                        r.id,
                        r.type,
                        r.shard,
                        r.priority,
                        r.payload,
                        r.status,
                        r.run_at,
                        r.max_attempts,
                        r.lease_ttl_ms,
                        r.enqueued_at,
                        r.updated_at,
                        advance.name,
                        version,
                    ),
                )
                if got:
                    created.append(r.id)
        return created


def _new_version(row: ScheduleRow, now: int) -> ScheduleRow:
    return replace(
        row,
        version=row.version + 1,
        changed_at=now,
        cursor_ms=now,
        cleanup_pending=True,
        updated_at=now,
    )


async def _select(tx: Tx, name: str, for_update: bool = False) -> ScheduleRow | None:
    sql = f"SELECT {_COLUMNS} FROM schedules WHERE name = ?"
    if for_update and tx.supports_for_update:
        sql += " FOR UPDATE"
    rows = await tx.execute(sql, (name,))
    return ScheduleRow.from_row(rows[0]) if rows else None


async def _update(tx: Tx, row: ScheduleRow) -> None:
    names = [n for n in _NAMES if n != "name"]
    assignments = ", ".join(f"{n} = ?" for n in names)
    await tx.execute(
        f"UPDATE schedules SET {assignments} WHERE name = ?", [*(getattr(row, n) for n in names), row.name]
    )


def _values(row: ScheduleRow) -> list[Any]:
    return [getattr(row, n) for n in _NAMES]

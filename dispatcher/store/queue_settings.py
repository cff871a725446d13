"""Queue settings rows: each job type's flow control (pause, limits, weights) as JSON text.

The DB is where settings live; Redis holds a mirror that the lease script reads
(dispatcher/queue/flow_mirror.py). A type without a row has the default settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardq_common.clock import wall_ms

if TYPE_CHECKING:
    from .base import Tx


@dataclass(frozen=True)
class QueueSettingsRow:
    job_type: str
    settings: dict[str, Any]  # QueueSettings.to_json()
    updated_at: int


class QueueSettingsQueries:
    """Mixed into Store: every method is one transaction."""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def put_queue_settings(self, job_type: str, settings: dict[str, Any]) -> QueueSettingsRow:
        now = wall_ms()
        async with self.transaction() as tx:
            await tx.execute(
                "INSERT INTO queue_settings (job_type, settings, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (job_type) DO UPDATE SET settings = excluded.settings, "
                "updated_at = excluded.updated_at",
                (job_type, json.dumps(settings, sort_keys=True), now),
            )
        return QueueSettingsRow(job_type, settings, now)

    async def update_queue_settings(
        self, job_type: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Read the type's settings (None: no row), let ``change`` make the new ones (None: delete the
        row; it may raise to change nothing) and write them, in one transaction, so that two
        concurrent changes of different fields (a pause and a limit) both hold. Returns (old, new)."""
        async with self.transaction() as tx:
            sql = "SELECT settings FROM queue_settings WHERE job_type = ?"
            if tx.supports_for_update:
                sql += " FOR UPDATE"
            rows = await tx.execute(sql, (job_type,))
            old = json.loads(rows[0][0]) if rows else None
            new = change(old)
            if new is None:
                if old is not None:
                    await tx.execute("DELETE FROM queue_settings WHERE job_type = ?", (job_type,))
            elif new != old:
                await tx.execute(
                    "INSERT INTO queue_settings (job_type, settings, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (job_type) DO UPDATE SET settings = excluded.settings, "
                    "updated_at = excluded.updated_at",
                    (job_type, json.dumps(new, sort_keys=True), wall_ms()),
                )
        return old, new

    async def get_queue_settings(self, job_type: str) -> QueueSettingsRow | None:
        async with self.transaction() as tx:
            rows = await tx.execute(
                "SELECT job_type, settings, updated_at FROM queue_settings WHERE job_type = ?", (job_type,)
            )
        return _row(rows[0]) if rows else None

    async def delete_queue_settings(self, job_type: str) -> bool:
        async with self.transaction() as tx:
            rows = await tx.execute(
                "DELETE FROM queue_settings WHERE job_type = ? RETURNING job_type", (job_type,)
            )
        return bool(rows)

    async def list_queue_settings(self) -> list[QueueSettingsRow]:
        async with self.transaction() as tx:
            rows = await tx.execute(
                "SELECT job_type, settings, updated_at FROM queue_settings ORDER BY job_type"
            )
        return [_row(r) for r in rows]


def _row(row: tuple[Any, ...]) -> QueueSettingsRow:
    return QueueSettingsRow(str(row[0]), json.loads(row[1]), int(row[2]))

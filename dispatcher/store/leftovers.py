"""Queries of the rows that outlive what they describe: per-type rows of types that have no job,
and the retired versions of deleted schedules whose jobs retention has deleted. The type sweep
(queue/type_sweep.py) removes them; each is bounded then by what exists, not by every name ever used.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Tx

#: A retired schedule version is kept at least this long after its schedule's deletion, whatever
#: its jobs: an id can outlive its row for up to an hour as a cancel note in Redis (a cancel that came
#: before the job's push, ``cancelled-unqueued``), and a schedule created again under the name must
#: not materialize an occurrence whose push such a note would skip.
RETIRED_VERSION_MIN_AGE_MS = 3_600_000


class LeftoverQueries:
    """Mixed into Store: every method is one transaction."""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def types_without_rows(self, job_types: Sequence[str]) -> list[str]:
        """Those of these types with no job row in any state (SQL-enqueued jobs not yet pushed
        included: they have their row) and no settings row. One index probe per type (jobs_type_id)."""
        idle = []
        async with self.transaction() as tx:
            for job_type in job_types:
                rows = await tx.execute(
                    "SELECT (SELECT 1 FROM jobs WHERE type = ? LIMIT 1), "
                    "(SELECT 1 FROM queue_settings WHERE job_type = ?)",
                    (job_type, job_type),
                )
                if rows[0][0] is None and rows[0][1] is None:
                    idle.append(job_type)
        return idle

    async def forget_empty_dead_counts(self) -> int:
        """Delete the dead-letter depths at 0. A row at 0 says what its absence says (readers take a
        missing row as 0), and the triggers that count a job entering the dead state insert the row
        again (an upsert). Racing one: the delete either runs first (the upsert then inserts 1) or
        sees its 1 and keeps the row (PostgreSQL checks the WHERE again on the updated row; SQLite has
        one writer). Returns the rows deleted."""
        async with self.transaction(durable=False) as tx:
            rows = await tx.execute("DELETE FROM dead_counts WHERE n = 0 RETURNING type")
        return len(rows)

    async def forget_retired_versions(self, now_ms: int) -> int:
        """Delete the retired versions of schedule names that no job row carries any more, retired
        over RETIRED_VERSION_MIN_AGE_MS ago. A retired version exists so that a schedule created
        again under the name does not give its occurrences the job ids (from name, version, time) of
        the deleted one's jobs; once retention deleted the last of those, no id can collide with
        a row, and none of the deleted schedule's versions makes a job again (its row is gone, and
        only a schedule's row materializes). Returns the rows deleted."""
        async with self.transaction(durable=False) as tx:
            rows = await tx.execute(
                "DELETE FROM retired_schedule_versions WHERE retired_at < ? AND NOT EXISTS "
                "(SELECT 1 FROM jobs WHERE jobs.schedule = retired_schedule_versions.name) RETURNING name",
                (now_ms - RETIRED_VERSION_MIN_AGE_MS,),
            )
        return len(rows)

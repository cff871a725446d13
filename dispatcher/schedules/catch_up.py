"""Which occurrences one scheduler tick materializes, and which it skips. Pure: no I/O, no clock.

An occurrence materialized no later than the misfire grace after its time is on time and always
runs. One older than that was missed (no scheduler ran: downtime, a long failover) and the
schedule's catch-up policy decides:
- ``all``: every missed occurrence no older than ``now - max_lag``;
- ``latest``: only the most recent missed one, if no older than ``now - max_lag``;
- ``none``: none of them.
Whatever is not materialized is skipped: counted and logged, never silently dropped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .cron import Cron


class CatchUp(enum.StrEnum):
    ALL = "all"
    LATEST = "latest"
    NONE = "none"


@dataclass(frozen=True)
class TickPlan:
    materialize: tuple[int, ...]  # occurrence instants (ms) that become jobs
    skipped: tuple[int, ...]
    cursor: int  # every occurrence at or before it is dealt with
    behind: bool  # `limit` was reached: more occurrences are due, tick again at once


def plan_tick(
    cron: Cron,
    policy: CatchUp,
    max_lag_ms: int,
    cursor_ms: int,
    now_ms: int,
    lookahead_ms: int,
    grace_ms: int,
    limit: int,
) -> TickPlan:
    """Deal with the occurrences after `cursor_ms` up to `now_ms + lookahead_ms`, at most `limit`
    (>= 2) of them, so a long downtime is caught up over several bounded ticks."""
    found = cron.occurrences(cursor_ms, now_ms + lookahead_ms, limit)
    behind = len(found) >= limit
    missed_until = now_ms - grace_ms
    oldest_allowed = now_ms - max_lag_ms
    on_time = [o for o in found if o > missed_until]
    missed = [o for o in found if o <= missed_until]
    if behind and not on_time and policy is CatchUp.LATEST:
        # The latest missed occurrence may lie beyond this batch: hold the last one back so the
        # next tick, which starts after the one before it, still sees it.
        found, missed = found[:-1], missed[:-1]
    if policy is CatchUp.ALL:
        caught_up = [o for o in missed if o >= oldest_allowed]
    elif policy is CatchUp.LATEST:
        caught_up = (
            [missed[-1]] if missed and missed[-1] >= oldest_allowed and (on_time or not behind) else []
        )
    else:
        caught_up = []
    keep = set(caught_up)
    skipped = tuple(o for o in missed if o not in keep)
    cursor = found[-1] if found else cursor_ms
    return TickPlan(tuple(caught_up + on_time), skipped, cursor, behind)

"""The type sweep: what a job type leaves behind after its last job is removed, and the per-key
gates and holds of a type whose per-key rate is gone are trimmed.

Redis keeps per-type fields that no job's removal deletes: ``keyed`` (the type has had keyed jobs),
``kvt`` (its keys' round's last turn, per class) and ``kcfg`` (the settings its blocked keys were
last weighed against, per class); ``kgate:<type>``/``khold:<type>`` keep the arrival times and holds
of its keys, trimmed by its leases only while it has per-key rates or holds. The database keeps a
``dead_counts`` row per (type, priority) that ever had a dead job, and a ``retired_schedule_versions``
row per schedule name ever deleted. An application that makes up type or schedule names would grow
each without bound.

Each shard's pruner (pruner.py) runs the sweep after a complete pass, at most every SWEEP_INTERVAL_S:

1. the types with fields in the shard's ``keyed``, ``kvt`` and ``kcfg`` (a scan of the three);
2. of those, the ones with no job row in any state and no settings row (one index probe each);
3. forget_types.lua with those, in one call per batch: it trims every named type's gates and holds
   past their time, and forgets the fields of a type only if it still has no active job in the
   shard, no settings mirrored and no hold to come, checked in the call itself. A job that arrives
   between step 2 and 3 has been pushed (its counts are there: the type is kept) or has not (its
   push starts the fields afresh after the call); either way nothing it needs is lost.
4. the owner of shard 0 also deletes the ``dead_counts`` rows at 0 and the retired schedule versions
   no job carries any more (store/leftovers.py says why each is safe).

The dispatcher's ``SessionRegistry.limited`` is bounded apart from the sweep: it keeps only the
types of the process's worker streams (sessions.py).
"""

from __future__ import annotations

import structlog

from shardq_common.clock import steady_ms, wall_ms

from ..store import Store
from .working_set import WorkingSet

log = structlog.get_logger("shardq.type_sweep")
#: The sweep runs after a complete retention pass, at most this often per shard.
SWEEP_INTERVAL_S = 60.0
#: The shard whose owner sweeps the database's cluster-wide rows (every cluster has a shard 0).
CLUSTER_ROWS_SHARD = 0


async def sweep_types(store: Store, working_set: WorkingSet, shard: int) -> list[str]:
    """One sweep of the shard. Returns the types whose fields it forgot."""
    candidates = sorted(await working_set.types_with_fields(shard))
    forgotten: list[str] = []
    if candidates:
        idle = await store.types_without_rows(candidates)
        others = sorted(set(candidates) - set(idle))
        forgotten = await working_set.forget_types(shard, idle, others, steady_ms())
    if shard == CLUSTER_ROWS_SHARD:
        dead = await store.forget_empty_dead_counts()
        retired = await store.forget_retired_versions(wall_ms())
        if dead or retired:
            log.info("swept rows", dead_counts=dead, retired_schedule_versions=retired)
    if forgotten:
        log.info("forgot job types", shard=shard, types=len(forgotten))
    return forgotten

"""The Redis working set (its Lua scripts, records, keys, states), the checks a job passes on its
way in (validation), and the work over the working set: shard ownership (fencing), ingest, worker
sessions and the leases they return, cancel, what follows a transition, the per-shard loops
(promoter, reaper), status writer, reconciler."""

from __future__ import annotations

"""The Redis working set (its Lua scripts, records, keys, states) and the per-shard work
over it: shard ownership (fencing), ingest, worker sessions, promoter, reaper, status writer,
reconciler."""

from __future__ import annotations

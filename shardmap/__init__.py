"""Pure shard logic: job type -> logical shard. No I/O.

The hash is CRC-32 (IEEE 802.3, as zlib.crc32) of the job type's UTF-8 bytes,
modulo the cluster's shard count S. It is stable across processes, Python
versions and languages (every standard library has CRC-32), so any client or
dispatcher computes the same shard for a type.

Ownership of shards by dispatchers (balanced plans, moves, rendezvous fallback) is in
``shardmap.plan`` and re-exported here.
"""

from __future__ import annotations

import zlib

from shardmap.plan import Move, apply_moves, balanced_plan, diff, fallback_owner

__all__ = [
    "DEFAULT_SHARD_COUNT",
    "MAX_SHARD_COUNT",
    "Move",
    "apply_moves",
    "balanced_plan",
    "diff",
    "fallback_owner",
    "shard_for",
]

DEFAULT_SHARD_COUNT = 64
MAX_SHARD_COUNT = 16384  # the number of Redis Cluster slots


def shard_for(job_type: str, shard_count: int) -> int:
    """Return the shard in ``[0, shard_count)`` that owns ``job_type``."""
    if not 1 <= shard_count <= MAX_SHARD_COUNT:
        raise ValueError(f"shard_count must be in 1..{MAX_SHARD_COUNT}, got {shard_count}")
    return zlib.crc32(job_type.encode("utf-8")) % shard_count

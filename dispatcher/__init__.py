"""shardq dispatcher: the daemon that owns shards of the Redis working set."""

from __future__ import annotations

__version__ = "0.1.0"
PROTOCOL_VERSION = 1

"""shardq dispatcher: the daemon that owns shards of the Redis working set."""

from __future__ import annotations

__version__ = "0.1.0"
# 2: a worker message may carry credit with its results (WorkerMessage.then_credit).
PROTOCOL_VERSION = 2

"""Every Redis key shardq uses, built in one place.

All keys of one shard share the Redis Cluster hash tag ``{s<N>}``, so each Lua
script touches one slot, and every key a script touches is passed in KEYS.
"""

from __future__ import annotations

from dataclasses import dataclass

from .states import Priority

PREFIX = "shardq"


@dataclass(frozen=True)
class ShardKeys:
    shard: int

    @property
    def tag(self) -> str:
        return f"{PREFIX}:{{s{self.shard}}}"

    @property
    def meta(self) -> str:
        """Hash: epoch and owner of the shard. Its absence means Redis lost the shard."""
        return f"{self.tag}:meta"

    @property
    def jobs(self) -> str:
        """Hash: job id -> msgpack job record (see records.py)."""
        return f"{self.tag}:jobs"

    @property
    def payloads(self) -> str:
        """Hash: job id -> payload bytes, for jobs not yet finished."""
        return f"{self.tag}:payloads"

    @property
    def results(self) -> str:
        """Hash: job id -> the result its worker acked it with, kept with the finished record until
        its row holds it (forget_jobs drops both)."""
        return f"{self.tag}:results"

    @property
    def delayed(self) -> str:
        """Sorted set: job id scored by run_at (ms)."""
        return f"{self.tag}:delayed"

    @property
    def leased(self) -> str:
        """Sorted set: job id scored by lease deadline (ms)."""
        return f"{self.tag}:leased"

    @property
    def counts(self) -> str:
        """Hash: '<type>|<class>|<state>' -> number of jobs, for stats and metrics."""
        return f"{self.tag}:counts"

    @property
    def seq(self) -> str:
        """Counter: FIFO order in the ready sets and the serial part of lease tokens."""
        return f"{self.tag}:seq"

    @property
    def types(self) -> str:
        """Set: job types seen in this shard."""
        return f"{self.tag}:types"

    @property
    def cancelled_unqueued(self) -> str:
        """Sorted set: ids of jobs cancelled before their enqueue reached Redis, scored by when
        (ms). Their push skips them; entries older than an hour are dropped."""
        return f"{self.tag}:cancelled-unqueued"

    @property
    def unpushed(self) -> str:
        """Sorted set: ids of committed jobs whose push failed, scored by when (ms), noted by the
        process that held them. The reconciler restores them as expected, not as jobs Redis lost;
        entries older than an hour are dropped."""
        return f"{self.tag}:unpushed"

    def ready(self, job_type: str, priority: Priority | int) -> str:
        """Sorted set: ready job ids of one type and class, scored by the order they became ready."""
        return f"{self.tag}:ready:{int(priority)}:{job_type}"


CLUSTER_KEY = f"{PREFIX}:cluster"  # hash: shard_count
MEMBERS_KEY = f"{PREFIX}:members"  # hash: dispatcher id -> address
ALIVE_KEY = f"{PREFIX}:alive"  # sorted set: dispatcher id scored by when its membership lapses (ms)
ASSIGNMENT_KEY = f"{PREFIX}:assignment"  # hash: shard -> dispatcher id, written by rebalance
DIRTY_KEY = f"{PREFIX}:dirty"  # set: shards whose owner should reconcile them (a push or hand-off failed)

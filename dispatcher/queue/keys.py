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

    # -- flow control (flow.py). The scripts build the per-type and per-key names below themselves
    # (includes/flow.lua): a lease meets keys it could not name in advance. All share the shard's
    # hash tag, so they live in the slot of the keys the script is given.

    @property
    def flow(self) -> str:
        """Hash: job type -> its QueueSettings, packed (the DB's settings, mirrored)."""
        return f"{self.tag}:flow"

    @property
    def flow_generation(self) -> str:
        """Counter: raised by a process that changed the settings of one of the shard's types, before
        it reads them back. A write of ``flow`` from settings read earlier is refused (mirror_flow.lua)."""
        return f"{self.tag}:flow-generation"

    @property
    def keyed(self) -> str:
        """Hash: job type -> 1 once a job of the type with a concurrency key arrived: its leases look
        at the keys' sets too."""
        return f"{self.tag}:keyed"

    @property
    def key_turns(self) -> str:
        """Hash: '<class>:<type>' -> the last turn number given in the keys' round robin: a key
        joins the round, or goes back to it after its turn, with the next one (at the back)."""
        return f"{self.tag}:kvt"

    @property
    def gate(self) -> str:
        """Sorted set: job type scored by its rate limit's theoretical arrival time (GCRA, steady ms);
        one not past it leases no sooner than that minus the burst's tolerance. Past it: dropped."""
        return f"{self.tag}:gate"

    @property
    def hold(self) -> str:
        """Sorted set: job type scored by the end of a RateLimited hold of its jobs without a key
        (steady ms): it leases none of them before. Past it: dropped."""
        return f"{self.tag}:hold"

    def eligible_keys(self, job_type: str, priority: Priority | int) -> str:
        """Sorted set: the concurrency keys of one type and class with ready jobs that may lease now,
        scored by turn number (the lowest goes next); '' stands for the type's jobs without a key."""
        return f"{self.tag}:kq:{int(priority)}:{job_type}"

    def blocked_keys(self, job_type: str) -> str:
        """Hash: concurrency key -> the classes (a bit each) in which it has ready jobs but reached
        its limit: out of those rounds until one of its leases ends or the type's settings change."""
        return f"{self.tag}:kblocked:{job_type}"

    @property
    def key_settings_seen(self) -> str:
        """Hash: '<class>:<type>' -> the type's packed settings its blocked keys were last weighed
        against: when they differ, the blocked keys rejoin the round to be weighed again."""
        return f"{self.tag}:kcfg"

    def key_turns_taken(self, job_type: str, priority: Priority | int) -> str:
        """Hash: weighted key -> leases it took in a row at the head of the round (up to its weight)."""
        return f"{self.tag}:kturn:{int(priority)}:{job_type}"

    def waiting_keys(self, job_type: str, priority: Priority | int) -> str:
        """Sorted set: keys with ready jobs waiting for their rate limit, scored by when (ms)."""
        return f"{self.tag}:kw:{int(priority)}:{job_type}"

    def key_ready(self, job_type: str, priority: Priority | int, key: str) -> str:
        """Sorted set: ready job ids of one concurrency key, scored like the ready sets (FIFO)."""
        return f"{self.tag}:kr:{int(priority)}:{len(job_type)}:{job_type}:{key}"

    def key_running(self, job_type: str) -> str:
        """Hash: concurrency key -> its jobs leased now (absent: none)."""
        return f"{self.tag}:krun:{job_type}"

    def key_gate(self, job_type: str) -> str:
        """Sorted set: concurrency key scored by its rate's theoretical arrival time, as ``gate``."""
        return f"{self.tag}:kgate:{job_type}"

    def key_hold(self, job_type: str) -> str:
        """Sorted set: concurrency key scored by the end of a RateLimited hold, as ``hold``."""
        return f"{self.tag}:khold:{job_type}"


CLUSTER_KEY = f"{PREFIX}:cluster"  # hash: shard_count
MEMBERS_KEY = f"{PREFIX}:members"  # hash: dispatcher id -> address
ALIVE_KEY = f"{PREFIX}:alive"  # sorted set: dispatcher id scored by when its membership lapses (ms)
ASSIGNMENT_KEY = f"{PREFIX}:assignment"  # hash: shard -> dispatcher id, written by rebalance
DIRTY_KEY = f"{PREFIX}:dirty"  # set: shards whose owner should reconcile them (a push or hand-off failed)

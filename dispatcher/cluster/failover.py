"""Noticing that another Redis master answers now: a failover or a restart.

Replication is asynchronous: a replica promoted in a failover can lack the last writes of its old
master, and a restart loses what persistence had not written yet (everything, without it). When
everything is lost the shards' meta hashes go too, and the scripts' epoch check sends each shard
through recovery and the reconciler. But a promoted replica usually keeps the meta hashes (written
long before) while lacking the jobs pushed in its last moments: nothing would restore them before
the periodic full reconcile. So the coordinator asks, every tick, which master it is talking to:
its ``run_id`` (new at every start) and ``master_replid`` (new when a replica becomes master). When
either changed, the owned shards are reconciled at once (the reconciler restores, from the DB,
every job Redis lacks; a job whose ack was lost runs again: at least once).

On a Redis Cluster every master is asked: a change on any of them reconciles every owned shard.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.exceptions import ResponseError

from ..ops.redis_client import ShardqRedisCluster, reconnect_all
from ..ops.redis_errors import redis_transient

log = structlog.get_logger("shardq.failover")

Identity = frozenset[tuple[str, str]]  # (run_id, master_replid) of each master


class MasterWatch:
    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._seen: Identity | None = None
        self._enabled = True

    async def changed(self) -> bool:
        """Whether the master (any master, on a cluster) is another than at the last call. The first
        call only learns it."""
        if not self._enabled:
            return False
        try:
            identity = await self._identity()
        except ResponseError as exc:
            if redis_transient(exc):
                raise
            # NOPERM, or a provider that renamed or disabled INFO.
            log.warning("cannot read INFO: a failover to a lagging replica goes unnoticed", error=str(exc))
            self._enabled = False
            return False
        if identity is None:
            return False
        seen, self._seen = self._seen, identity
        if seen is None or identity == seen:
            return False
        log.warning(
            "another Redis master answers (failover or restart)", before=sorted(seen), now=sorted(identity)
        )
        await self._reconnect()  # other connections may still reach the old master, now a replica
        return True

    async def _identity(self) -> Identity | None:
        if isinstance(self.redis, ShardqRedisCluster):
            replies = await self.redis.info(target_nodes=ShardqRedisCluster.PRIMARIES)
            infos = [replies] if "run_id" in replies else list(replies.values())
        else:
            info = await self.redis.info()
            if info.get("role") != "master":
                # A connection left on a demoted master (it has not written since, or it would have
                # met READONLY): every connection connects again, to what the URL reaches now.
                await self._reconnect()
                return None
            infos = [info]
        return frozenset((str(i.get("run_id", "")), str(i.get("master_replid", ""))) for i in infos)

    async def _reconnect(self) -> None:
        if not isinstance(self.redis, ShardqRedisCluster):  # a cluster client follows MOVED itself
            await reconnect_all(self.redis.connection_pool)

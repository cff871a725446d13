"""failover.MasterWatch against real servers: a restart, a replica promoted, and a Redis Cluster."""

from __future__ import annotations

from dispatcher.cluster.failover import MasterWatch
from dispatcher.ops.redis_client import connect


async def test_a_restart_and_a_promotion_are_noticed_once_each(private_redis):
    redis = connect(private_redis.url)
    watch = MasterWatch(redis)
    try:
        assert not await watch.changed()  # the first call only learns the master
        assert not await watch.changed()
        private_redis.restart()  # a new run_id
        assert await watch.changed()
        assert not await watch.changed()
        with private_redis.client() as r:
            r.execute_command("REPLICAOF", "127.0.0.1", "1")
            assert not await watch.changed()  # a replica answers: not a master to compare
            r.execute_command("REPLICAOF", "NO", "ONE")  # promoted: a new master_replid
        assert await watch.changed()
        assert not await watch.changed()
    finally:
        await redis.aclose()


async def test_a_server_refusing_info_is_not_watched(private_redis):
    with private_redis.client() as r:
        r.execute_command("ACL", "SETUSER", "default", "-info")
    redis = connect(private_redis.url)
    watch = MasterWatch(redis)
    try:
        assert not await watch.changed()  # NOPERM: a warning, and no watch from then on
        private_redis.restart()
        assert not await watch.changed()
    finally:
        await redis.aclose()


async def test_every_cluster_master_is_watched(redis_cluster_url):
    redis = connect(redis_cluster_url)
    watch = MasterWatch(redis)
    try:
        assert not await watch.changed()
        assert not await watch.changed()
        assert watch._seen is not None and len(watch._seen) == 3
    finally:
        await redis.aclose()

"""failover.MasterWatch against real servers: a restart, a replica promoted, and a Redis Cluster."""

from __future__ import annotations

import asyncio

from dispatcher.cluster.failover import MasterWatch
from dispatcher.ops.redis_client import connect
from tests.support.redis_server import connected, running
from tests.support.wait import wait_for

UNDER_TEST = "reconnect-under-test"  # the client name of the connections the test watches


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


async def test_a_command_in_flight_is_not_cut_when_another_master_is_noticed(private_redis):
    """The connections connect again once their command's reply is read: one closed under a
    command would make redis-py send it again, and a lease script sent twice grants its jobs twice
    (the first grant never reaches a worker and waits out its lease)."""
    redis = connect(private_redis.url, client_name=UNDER_TEST)
    watch = MasterWatch(redis)
    try:
        assert not await watch.changed()
        private_redis.restart()
        with private_redis.client() as r:
            in_flight = asyncio.create_task(redis.blpop(["waiting"], timeout=10))
            await wait_for(lambda: running(r, "blpop"), timeout=5, message="BLPOP never sent")
            assert await watch.changed()
            r.rpush("waiting", "job")
            assert await in_flight == (b"waiting", b"job")
            assert r.info("commandstats")["cmdstat_blpop"]["calls"] == 1  # sent once, not cut and sent again
            # ... and every connection connected before the change is closed, the BLPOP's once done.
            await wait_for(
                lambda: not connected(r, UNDER_TEST),
                timeout=5,
                message=lambda: f"still open: {connected(r, UNDER_TEST)}",
            )
            assert await redis.ping()  # and the client goes on
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

"""The dispatcher's Redis client (ops/redis_client.py) against a real server."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.ops.redis_client import ReadOnlyReplica, connect
from tests.support.redis_server import connected, running
from tests.support.wait import wait_for

UNDER_TEST = "reconnect-under-test"  # the client name of the connections the test watches

# What a demoted master answers a write with; redis-py raises ReadOnlyError for it.
READONLY_REPLY = "return redis.error_reply('READONLY You can\\'t write against a read only replica.')"


async def test_a_readonly_reply_leaves_the_other_connections_commands_in_flight(private_redis):
    """READONLY makes every connection connect again, but not by cutting another connection's
    command: redis-py would send that one again, after the server may have run it."""
    redis = connect(private_redis.url, client_name=UNDER_TEST)
    try:
        with private_redis.client() as r:
            in_flight = asyncio.create_task(redis.blpop(["waiting"], timeout=10))
            await wait_for(lambda: running(r, "blpop"), timeout=5, message="BLPOP never sent")
            with pytest.raises(ReadOnlyReplica):  # retried, and READONLY each time
                await redis.eval(READONLY_REPLY, 0)
            r.rpush("waiting", "job")
            assert await in_flight == (b"waiting", b"job")
            assert r.info("commandstats")["cmdstat_blpop"]["calls"] == 1
            # ... and every connection, the BLPOP's once done, connects again to follow the master.
            await wait_for(
                lambda: not connected(r, UNDER_TEST),
                timeout=5,
                message=lambda: f"still open: {connected(r, UNDER_TEST)}",
            )
            assert await redis.ping()
    finally:
        await redis.aclose()

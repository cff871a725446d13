"""The queue settings' mirror in Redis between processes: a pass of the shard's owner that read the
DB just before another process changed a type's settings must not put the old settings back over the
new ones in Redis (a pause undone for a second lets that second's leases through). Two FlowMirrors on
one real Redis and one real store; the owner's DB read is held open at the moment that matters."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.ops.redis_client import connect
from dispatcher.queue.flow import QueueSettings
from dispatcher.queue.flow_mirror import FlowMirror
from dispatcher.queue.flow_settings import FlowSettings
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.states import Priority
from dispatcher.store import open_store
from shardmap import shard_for

SHARDS = 8


class HeldReads:
    """The real store, whose next settings read returns its rows only once ``release`` is set."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.read = asyncio.Event()
        self.release = asyncio.Event()
        self.hold = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def list_queue_settings(self) -> Any:
        rows = await self.store.list_queue_settings()
        if self.hold:
            self.hold = False
            self.read.set()
            await self.release.wait()
        return rows


async def _mirrored(redis: Any, job_type: str) -> QueueSettings | None:
    raw = await redis.hget(ShardKeys(shard_for(job_type, SHARDS)).flow, job_type)
    return None if raw is None else QueueSettings.unpack(job_type, raw)


async def test_an_owner_pass_that_read_before_a_change_does_not_undo_it(db_url: str, redis_url: str) -> None:
    store = await open_store(db_url)
    await store.migrate()
    redis = connect(redis_url)
    held = HeldReads(store)
    owner = FlowMirror(held, redis, SHARDS, owned=lambda: range(SHARDS), notify_shard=lambda shard: None)
    other = FlowMirror(store, redis, SHARDS, owned=lambda: (), notify_shard=lambda shard: None)
    try:
        held.hold = True
        stale_pass = asyncio.create_task(owner.refresh())
        await asyncio.wait_for(held.read.wait(), 10)  # the owner has read the DB: no settings yet

        settings, changed = await FlowSettings(store, other).change(
            "noop", lambda s: QueueSettings("noop", paused=frozenset({Priority.HIGH}))
        )
        assert changed
        assert (await _mirrored(redis, "noop")) == settings  # in Redis as the change answers

        held.release.set()
        await asyncio.wait_for(stale_pass, 10)
        assert (await _mirrored(redis, "noop")) == settings, "the owner's stale pass undid the pause"

        await owner.refresh()  # the owner's next pass reads the change and keeps it
        assert (await _mirrored(redis, "noop")) == settings
        await FlowSettings(store, other).change("noop", lambda s: QueueSettings("noop"))
        await owner.refresh()
        assert await _mirrored(redis, "noop") is None  # and a removal leaves the owner's hash
    finally:
        await redis.aclose()
        await store.close()

"""The mirror of the queue settings (the DB's ``queue_settings``) in Redis, where the lease script
reads them: ``ShardKeys(shard).flow``, a hash of job type -> ``QueueSettings.pack()``.

Every process keeps the hashes of the shards it owns equal to the DB:

- before a shard it acquires serves any lease (Ownership calls ``before_serving`` between taking the
  shard in Redis and leasing from it): after Redis lost its data the shard comes back with its
  settings, so a paused queue never runs for want of its mirror;
- on every pass, about once a second: the settings are read from the DB again and every owned
  shard's hash is compared and mended, so a change made through another process arrives, and a
  FLUSHALL of a shard still owned heals, within a pass;
- at once after a change this process made (``changed``): it writes the type's hash whichever
  process owns the shard, so a pause holds at the next lease round.

A write may come from settings read a moment before another process's change: each shard has a
generation counter that a changing process raises before it reads its change back, and every write
reads the counter before its DB read and is refused if it moved since (mirror_flow.lua). The latest
changer's write, or the owner's next pass, brings the newer settings; old ones never go back over
them.

A type whose settings changed has its shard's waiting workers look again (``notify_shard``): a
resumed queue or a raised limit leases at once instead of at the next wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from shardmap import shard_for
from shardq_common.errors import StoreUnavailable
from shardq_common.wakeup import cancelling

from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..store import Store
from .flow import QueueSettings
from .keys import ShardKeys
from .scripting import script_source

log = structlog.get_logger("shardq.flow_mirror")
PASS_INTERVAL_S = 1.0


class FlowMirror:
    def __init__(
        self,
        store: Store,
        redis: Any,
        shard_count: int,
        owned: Callable[[], Iterable[int]],
        notify_shard: Callable[[int], None],
        interval_s: float = PASS_INTERVAL_S,
    ) -> None:
        self.store = store
        self.redis = redis
        self.shard_count = shard_count
        self.owned = owned  # the shards this process serves now
        self.notify_shard = notify_shard  # (shard): its waiting workers look again
        self.interval_s = interval_s
        #: job type -> its settings, as last read from the DB (types with the defaults are absent)
        self.settings: dict[str, QueueSettings] = {}
        self.loaded = False
        self._lock = asyncio.Lock()  # one write of the hashes at a time
        self._reads = 0  # DB reads begun
        self._applied = 0  # the read whose settings are loaded
        self.healthy = True
        self._mirror = redis.register_script(script_source("mirror_flow"))

    # -- reading ----------------------------------------------------------------------

    def of(self, job_type: str) -> QueueSettings:
        """The type's settings as last loaded (the defaults when it has none)."""
        return self.settings.get(job_type) or QueueSettings(job_type)

    def shard_of(self, job_type: str) -> int:
        return shard_for(job_type, self.shard_count)

    async def load(self) -> dict[str, QueueSettings]:
        """Read every type's settings from the DB; returns the types whose settings changed. The DB
        is read outside the lock (a DB outage must not hold up a shard's acquisition, which writes
        from the settings loaded last); a read that began before the one applied last is dropped."""
        self._reads += 1
        read = self._reads
        rows = await self.store.list_queue_settings()
        fresh: dict[str, QueueSettings] = {}
        for row in rows:
            try:
                settings = QueueSettings.from_json(row.job_type, row.settings)
            except Exception as exc:  # written by this code through validation: a hand-edited row
                log.error("unreadable queue settings ignored", type=row.job_type, error=str(exc))
                continue
            if settings.has_flow:  # retention alone is the pruner's, read from the DB
                fresh[row.job_type] = settings
        if read < self._applied:
            return {}
        self._applied = read
        changed = {
            t: fresh.get(t) or QueueSettings(t)
            for t in set(fresh) | set(self.settings)
            if fresh.get(t) != self.settings.get(t)
        }
        self.settings = fresh
        self.loaded = True
        return changed

    # -- writing ----------------------------------------------------------------------

    def _wanted(self, shard: int) -> dict[str, bytes]:
        return {t: s.pack() for t, s in self.settings.items() if self.shard_of(t) == shard}

    async def generations(self, shards: Iterable[int]) -> dict[int, bytes]:
        """The shards' generation counters, read before the DB is: the tokens write_shards needs."""
        shards = sorted(set(shards))
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.get(ShardKeys(shard).flow_generation)
            values = await pipe.execute()
        return {shard: bytes(value or b"") for shard, value in zip(shards, values, strict=True)}

    async def write_shards(self, generations: dict[int, bytes]) -> int:
        """Make the shards' hashes equal to the settings loaded, each unless its generation moved
        since it was read (another process changed one of its types meanwhile); returns how many
        fields changed. The hashes are read first, so that only a shard that differs runs the script."""
        shards = sorted(generations)
        if not shards:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hgetall(ShardKeys(shard).flow)
            current = await pipe.execute()
        fixes = 0
        for shard, have in zip(shards, current, strict=True):
            want = self._wanted(shard)
            if {_s(k): bytes(v) for k, v in have.items()} == want:
                continue
            keys = ShardKeys(shard)
            pairs = [part for item in want.items() for part in item]
            written = await self._mirror(
                keys=[keys.flow, keys.flow_generation], args=[generations[shard], *pairs]
            )
            fixes += max(int(written), 0)
        return fixes

    async def before_serving(self, shard: int) -> None:
        """Ownership's hook: the shard's settings are in Redis before it leases anything (those read
        last, when the DB cannot be read now). Raises when they cannot be written (the shard is then
        not served; it is acquired again later)."""
        generations = await self.generations({shard} | set(self.owned()))
        changed: dict[str, QueueSettings] = {}
        try:  # fresh: a change made a moment ago through another process is not undone
            changed = await self.load()
        except StoreUnavailable:
            if not self.loaded:
                raise
        async with self._lock:
            owned = set(self.owned())
            wanted = {shard} | {self.shard_of(t) for t in changed} & owned
            await self.write_shards({s: g for s, g in generations.items() if s in wanted})
        self._wake(changed, owned)

    async def refresh(self, *, also: Iterable[int] = ()) -> None:
        """One pass: reload from the DB, mend the owned shards' hashes (and those in ``also``), and
        wake the workers of the types that changed."""
        also = set(also)
        generations = await self.generations(set(self.owned()) | also)
        changed = await self.load()
        async with self._lock:
            owned = set(self.owned())  # one acquired since the generations were read: before_serving
            fixes = await self.write_shards({s: g for s, g in generations.items() if s in owned | also})
        if fixes and changed:
            log.info("queue settings mirrored", types=sorted(changed), fields_written=fixes)
        elif fixes:  # nothing changed in the DB, yet Redis differed: it lost the hash (FLUSHALL)
            log.warning("queue settings were missing in redis; written again", fields_written=fixes)
        self._wake(changed, owned)

    def _wake(self, changed: Iterable[str], owned: set[int]) -> None:
        for shard in {self.shard_of(t) for t in changed} & owned:
            self.notify_shard(shard)

    async def changed(self, job_type: str) -> None:
        """This process changed the type's settings in the DB: mirror them now. The generation goes
        up first, so that a write from settings read before the change is refused."""
        shard = self.shard_of(job_type)
        await self.redis.incr(ShardKeys(shard).flow_generation)
        await self.refresh(also=[shard])

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
                if not self.healthy:
                    log.info("queue settings mirror resumed")
                self.healthy = True
            except StoreUnavailable as exc:
                if self.healthy:
                    log.warning("queue settings not read; redis keeps the last ones", error=str(exc))
                self.healthy = False
            except REDIS_ERRORS as exc:
                note_redis_error("flow-mirror", exc)
                self.healthy = False
            except Exception:  # a bug: keep mirroring, say so loudly
                if cancelling():
                    raise
                log.exception("queue settings mirror pass failed")
                self.healthy = False


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

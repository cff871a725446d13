"""The WatchJob streams open in this process, and what wakes them: a job's transition or progress
report seen here (this process owns the job's shard, or took its ack or cancel). A watch also
looks again on its own every WATCH_RECHECK_S, which covers what other processes do (the DB and
Redis, read as GetJob reads them, are the truth); this only makes the owner's news immediate.

The hot path pays one dict lookup per transition batch when nobody watches."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from shardq_common.errors import ResourceExhausted, Unavailable

from ..ops import metrics

#: How often a watch reads its job again without news (the longest a change made by another process
#: waits to be seen, beside the status writer's own delay).
WATCH_RECHECK_S = 1.0


class Watch:
    """One stream's view of one job: woken by news, with the latest progress this process heard."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.progress: str | None = None  # newer than the DB's, while the job runs
        self._news = asyncio.Event()

    def notify(self) -> None:
        self._news.set()

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109 - a recheck period, not a deadline
        """Until news or ``timeout`` seconds; then ready for the next news."""
        try:
            async with asyncio.timeout(timeout):
                await self._news.wait()
        except TimeoutError:
            pass
        self._news.clear()


class Watches:
    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._by_job: dict[str, set[Watch]] = {}
        self._open = 0
        self.closing = False  # the process is stopping: every watch ends (its client reconnects)

    def close(self) -> None:
        self.closing = True
        for watchers in self._by_job.values():
            for watch in watchers:
                watch.notify()

    @contextmanager
    def open(self, job_id: str) -> Iterator[Watch]:
        """A watch of the job for the block; RESOURCE_EXHAUSTED past max_open in this process."""
        if self.closing:
            raise Unavailable("dispatcher is shutting down")
        if self._open >= self.max_open:
            raise ResourceExhausted(
                f"this dispatcher has {self._open} watches open, its limit (SHARDQ_MAX_WATCHES); try again"
            )
        watch = Watch(job_id)
        self._by_job.setdefault(job_id, set()).add(watch)
        self._open += 1
        metrics.WATCHES.inc()
        try:
            yield watch
        finally:
            self._open -= 1
            metrics.WATCHES.dec()
            watchers = self._by_job[job_id]
            watchers.discard(watch)
            if not watchers:
                del self._by_job[job_id]

    def changed(self, job_ids: Iterable[str]) -> None:
        """These jobs changed state here (leased, acked, nacked, expired, cancelled)."""
        if not self._by_job:
            return
        for job_id in job_ids:
            for watch in self._by_job.get(job_id, ()):
                watch.notify()

    def progress(self, job_id: str, progress: str) -> None:
        for watch in self._by_job.get(job_id, ()):
            watch.progress = progress
            watch.notify()

"""The soak's producer: the offered load as a function of time, and a thread that enqueues it.

Steady ``rate`` jobs/s, and a burst of ``burst_rate`` jobs/s for ``burst_seconds`` in the middle of
every ``burst_every`` seconds (the compressed day's busy hours). A share of the jobs is delayed by
up to ``max_delay`` seconds, a share fails (the worker raises for them; with ``max_attempts`` 2 they
are retried once, then dead-lettered). The thread keeps up with the offered load in batches sent
every TICK, several calls in flight; when the stack cannot take it, the deficit is dropped past one
second of it (the producer reports what it sent, not what it was asked to).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass

from worker_sdk import AsyncClient, ShardqError

TICK_S = 0.05
BATCH = 1000
IN_FLIGHT = 4


@dataclass(frozen=True)
class LoadShape:
    rate: float
    burst_rate: float
    burst_seconds: float
    burst_every: float
    delayed_share: float = 0.10
    max_delay: float = 30.0
    failing_share: float = 0.01

    def rate_at(self, t: float) -> float:
        if self.burst_every <= 0 or self.burst_seconds <= 0:
            return self.rate
        into = t % self.burst_every
        start = (self.burst_every - self.burst_seconds) / 2
        return self.burst_rate if start <= into < start + self.burst_seconds else self.rate

    def jobs_until(self, seconds: float) -> int:
        """The offered jobs over ``seconds``, to a second's precision."""
        return int(sum(self.rate_at(t + 0.5) for t in range(int(seconds))))


class Producer(threading.Thread):
    def __init__(self, target: str, types: list[str], shape: LoadShape, seed: int = 1) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.target, self.types, self.shape = target, types, shape
        self.random = random.Random(seed)
        self.sent = 0
        self.errors = 0
        self.dropped = 0
        self.stop = threading.Event()
        self.began = 0.0

    def run(self) -> None:
        asyncio.run(self._run())

    def _spec(self, seq: int, now_ms: float) -> dict:
        payload: dict = {"e": now_ms}
        spec: dict = {"type": self.types[seq % len(self.types)], "max_attempts": 2}
        if self.random.random() < self.shape.delayed_share:
            payload["d"] = 1
            spec["delay"] = self.random.uniform(1.0, self.shape.max_delay)
        if self.random.random() < self.shape.failing_share:
            payload["f"] = 1
        spec["payload"] = payload
        return spec

    async def _send(self, client: AsyncClient, count: int, seq: int) -> None:
        now_ms = time.time() * 1000
        specs = [self._spec(seq + i, now_ms) for i in range(count)]
        try:
            await client.enqueue_many(specs)
            self.sent += count
        except ShardqError:
            self.errors += 1

    async def _run(self) -> None:
        self.began = time.monotonic()
        owed = 0.0
        seq = 0
        last = self.began
        async with AsyncClient(self.target, route=True) as client:
            calls: set[asyncio.Task] = set()
            while not self.stop.is_set():
                now = time.monotonic()
                rate = self.shape.rate_at(now - self.began)
                owed += rate * (now - last)
                last = now
                if owed > rate + BATCH:  # more than a second behind: the stack cannot take it
                    self.dropped += int(owed - rate)
                    owed = float(rate)
                while owed >= 1 and len(calls) < IN_FLIGHT:
                    count = min(BATCH, int(owed))
                    owed -= count
                    task = asyncio.create_task(self._send(client, count, seq))
                    seq += count
                    calls.add(task)
                    task.add_done_callback(calls.discard)
                await asyncio.sleep(TICK_S)
            if calls:
                await asyncio.gather(*calls, return_exceptions=True)

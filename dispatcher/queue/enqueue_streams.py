"""The EnqueueStream calls open in this process, and how they end when it stops.

A stream carries a producer's single enqueues for as long as the producer runs, so a graceful stop
cannot wait for it to end by itself (the server's grace would run out on every stop, and the jobs
in flight would be cut off without an answer). ``close`` stops each stream's reading instead: the
jobs it has read commit and are answered, then the stream ends with a message saying that every
job without an answer was never read, which the client sends again.
"""

from __future__ import annotations

import asyncio

from shardq_common.errors import ResourceExhausted

from ..ops import metrics

# EnqueueStream calls open at once in one process, at most: a producer needs one per dispatcher
# process it sends to (a client holds one per address), so this is thousands of producers.
MAX_OPEN = 4096


class EnqueueStreams:
    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self.max_open = max_open
        self.closing = False  # the process is stopping: streams read nothing more and end
        self._readers: set[asyncio.Task[None]] = set()  # each open stream's reading task
        self._none_open = asyncio.Event()
        self._none_open.set()

    def admit(self) -> None:
        """RESOURCE_EXHAUSTED when max_open streams are open already."""
        if len(self._readers) >= self.max_open:
            raise ResourceExhausted(
                f"this dispatcher has {len(self._readers)} enqueue streams open, its limit; "
                "use fewer clients or send jobs with EnqueueMany"
            )

    def opened(self, reader: asyncio.Task[None]) -> None:
        """A stream (admitted) starts reading with ``reader``."""
        self._readers.add(reader)
        self._none_open.clear()
        metrics.ENQUEUE_STREAMS.set(len(self._readers))

    def ended(self, reader: asyncio.Task[None]) -> None:
        self._readers.discard(reader)
        metrics.ENQUEUE_STREAMS.set(len(self._readers))
        if not self._readers:
            self._none_open.set()

    async def close(self, timeout: float) -> None:
        """Stop reading every stream and wait (up to ``timeout`` s) until each has answered what it
        read and ended."""
        self.closing = True
        for reader in self._readers:
            reader.cancel()
        try:
            await asyncio.wait_for(self._none_open.wait(), timeout)
        except TimeoutError:
            pass

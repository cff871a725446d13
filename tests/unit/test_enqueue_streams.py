"""The registry of open EnqueueStream calls: its bound, and a stop that ends every stream."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.queue.enqueue_streams import EnqueueStreams
from shardq_common.errors import ResourceExhausted


async def _reading_until_cancelled(streams: EnqueueStreams, ends: asyncio.Event) -> None:
    """What a stream's reader does on a stop, as far as the registry sees it: it is cancelled, and
    its stream ends once the jobs it read are answered (``ends``)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await ends.wait()
        streams.ended(asyncio.current_task())  # type: ignore[arg-type]


async def test_a_stream_past_the_bound_is_refused_until_one_ends():
    streams = EnqueueStreams(max_open=2)
    readers = []
    for _ in range(2):
        streams.admit()
        readers.append(asyncio.create_task(asyncio.Event().wait()))
        streams.opened(readers[-1])
    with pytest.raises(ResourceExhausted, match="2 enqueue streams open"):
        streams.admit()
    streams.ended(readers[0])
    streams.admit()
    for reader in readers:
        reader.cancel()


async def test_close_cancels_every_reader_and_waits_for_their_streams_to_end():
    streams = EnqueueStreams()
    ends = asyncio.Event()
    readers = [asyncio.create_task(_reading_until_cancelled(streams, ends)) for _ in range(3)]
    for reader in readers:
        streams.opened(reader)
    await asyncio.sleep(0)
    closing = asyncio.create_task(streams.close(timeout=10))
    await asyncio.sleep(0.05)  # a while in which close() must not return
    assert streams.closing and not closing.done()  # the streams still answer what they read
    ends.set()
    await asyncio.wait_for(closing, 5)
    assert all(reader.done() for reader in readers)


async def test_close_gives_up_after_its_timeout():
    streams = EnqueueStreams()
    ends = asyncio.Event()
    reader = asyncio.create_task(_reading_until_cancelled(streams, ends))
    streams.opened(reader)
    await asyncio.wait_for(streams.close(timeout=0.1), 5)
    assert not reader.done()
    ends.set()
    await reader

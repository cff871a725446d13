"""EnqueueStream: single enqueues as messages on one long-lived stream (issue 24).

A unary call costs a call's setup at both ends; a message on an open stream costs about half of it
(docs/performance.md), and one job at a time waits for every microsecond of it. Each job read is
enqueued in a task of its own, so the jobs of one stream, and of many, share group commits as
concurrent unary calls do, and each answer goes back as its job commits, in whatever order. At most
IN_FLIGHT jobs of a stream are read and not yet answered: the stream is not read past that, and
HTTP/2 flow control holds the client back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from shardq_common.pb import shardq_pb2 as pb

from ..queue.enqueue_streams import EnqueueStreams
from .status import refusal

IN_FLIGHT = 256
CLOSED = pb.EnqueueStreamResponse(closed=True)

EnqueueOne = Callable[[pb.JobSpec], Awaitable[tuple[str, bool]]]


async def answer(
    requests: AsyncIterator[pb.EnqueueStreamRequest], enqueue_one: EnqueueOne, streams: EnqueueStreams
) -> AsyncIterator[pb.EnqueueStreamResponse]:
    if streams.closing:
        yield CLOSED  # nothing read: the client sends its jobs again, elsewhere or after the restart
        return
    streams.admit()
    answers: asyncio.Queue[pb.EnqueueStreamResponse | None] = asyncio.Queue()
    reader = asyncio.create_task(_read(requests, enqueue_one, answers), name="enqueue-stream")
    streams.opened(reader)
    try:
        while (message := await answers.get()) is not None:
            yield message
    finally:
        reader.cancel()  # the call ended first (the client went away): nobody reads answers now
        streams.ended(reader)


async def _read(
    requests: AsyncIterator[pb.EnqueueStreamRequest],
    enqueue_one: EnqueueOne,
    answers: asyncio.Queue[pb.EnqueueStreamResponse | None],
) -> None:
    """Read jobs until the client half-closes, or until cancelled (the process is stopping); then
    wait for the jobs read to be answered, and end the answers (with CLOSED when cancelled)."""
    slots = asyncio.Semaphore(IN_FLIGHT)
    running: set[asyncio.Task[None]] = set()
    cancelled = False
    try:
        received = aiter(requests)
        while True:
            await slots.acquire()
            try:
                request = await anext(received)
            except StopAsyncIteration:
                break
            # No await between the read and the task: a job read is a job answered.
            task = asyncio.create_task(_answer_one(request, enqueue_one, answers, slots))
            running.add(task)
            task.add_done_callback(running.discard)
    except asyncio.CancelledError:
        cancelled = True
    finally:
        if running:
            await asyncio.wait(set(running))
        if cancelled:
            answers.put_nowait(CLOSED)
        answers.put_nowait(None)


async def _answer_one(
    request: pb.EnqueueStreamRequest,
    enqueue_one: EnqueueOne,
    answers: asyncio.Queue[pb.EnqueueStreamResponse | None],
    slots: asyncio.Semaphore,
) -> None:
    try:
        job_id, created = await enqueue_one(request.job)
        message = pb.EnqueueStreamResponse(seq=request.seq, job_id=job_id, created=created)
    except Exception as exc:
        code, details = refusal(exc, "EnqueueStream")
        message = pb.EnqueueStreamResponse(seq=request.seq, error_code=code.value[0], error_message=details)
    finally:
        slots.release()
    answers.put_nowait(message)

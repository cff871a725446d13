"""Single enqueues on one long-lived ``EnqueueStream`` per dispatcher address (issue 24).

A unary call pays a call's setup at both ends; a message on an open stream about half of it, and a
producer that enqueues one job at a time waits for every bit of it (docs/performance.md has the
figures). Each client holds one stream per address it sends single jobs to, shared by its threads
(``Client``) or tasks (``AsyncClient``): a job goes out with a number, and its answer comes back
with that number, as the job commits.

What a caller sees is what a unary ``Enqueue`` gives: the job's id once it is committed, or the
job's own error (INVALID_ARGUMENT naming the field, ...) with nothing written. The ways a stream
ends decide what happens to the jobs it has not answered:

- the dispatcher is stopping: its last message (``closed``) says every job it read has been
  answered, so the others were never read; they are sent once more on a new stream (to the
  client's target when they were routed to an owner), and fail with UNAVAILABLE should that one be
  closing too;
- the dispatcher does not know the method (UNIMPLEMENTED: one older than the stream): nothing was
  read; the job goes as a unary call, and so does every later one to that address;
- a routed owner could not be reached at all ("failed to connect"): nothing was sent; the job goes
  to the target, as a routed unary call does (``_routing``);
- anything else (the process died, the network broke): as for a unary call that failed the same
  way, the job may or may not be committed, and the caller gets the error.

A job not answered within the client's timeout fails with DEADLINE_EXCEEDED (it may still commit),
and the stream stays open for the others.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from shardq_common.pb import shardq_pb2 as pb

from ._errors import ShardqError, UnavailableError, error_for, from_rpc_error
from ._routing import OwnerRoutes

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Ending:
    """Why a stream gave no answer to a job (besides an ``RpcError``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The dispatcher is stopping; the jobs it did not answer were never read.
CLOSED = _Ending("closed")
#: The dispatcher ended the stream without ``closed``: the jobs in flight are in doubt.
ENDED = _Ending("ended")
#: The client closed the stream.
CANCELLED = _Ending("cancelled")


class NotSent:
    """The stream had ended (with ``ending``) before this job could be sent on it."""

    def __init__(self, ending: _Ending | grpc.RpcError) -> None:
        self.ending = ending


Outcome = pb.EnqueueStreamResponse | _Ending | grpc.RpcError | NotSent


class Resend:
    """Send the job again: to ``address``, as a unary call when ``unary``."""

    def __init__(self, address: str, unary: bool = False) -> None:
        self.address = address
        self.unary = unary


class Attempts:
    """How one job's sending goes: each stream's outcome becomes the job's id, its error, or where
    to send it again. A job that finds its stream already ended is sent once on a new one; should
    that one have ended too, the job gets its ending as its own (a new stream that fails at once
    fails as a unary call would). At most one resend after a closing stream."""

    def __init__(self, address: str, target: str, routes: OwnerRoutes | None) -> None:
        self.address = address
        self.target = target
        self.routes = routes
        self._closed = 0
        self._not_sent = 0

    def settle(self, outcome: Outcome) -> str | Resend:
        if isinstance(outcome, pb.EnqueueStreamResponse):
            if outcome.error_code:
                code = _CODES.get(outcome.error_code, grpc.StatusCode.UNKNOWN)
                raise error_for(code, outcome.error_message)
            return outcome.job_id
        if isinstance(outcome, NotSent):
            self._not_sent += 1
            if self._not_sent == 1:
                return Resend(self.address)
            outcome = outcome.ending
        if outcome is CLOSED:
            self._closed += 1
            if self._closed > 1:
                raise UnavailableError(
                    grpc.StatusCode.UNAVAILABLE, "the dispatcher is shutting down; the job was not accepted"
                )
            self.address = self.target  # any dispatcher takes any job; the owner is going away
            return Resend(self.address)
        if outcome is ENDED:
            raise UnavailableError(
                grpc.StatusCode.UNAVAILABLE,
                "the enqueue stream ended before the job was answered; it may or may not be committed",
            )
        if outcome is CANCELLED:
            raise ShardqError(grpc.StatusCode.CANCELLED, "the client was closed")
        assert isinstance(outcome, grpc.RpcError)
        if outcome.code() is grpc.StatusCode.UNIMPLEMENTED:
            return Resend(self.address, unary=True)
        routes = self.routes if self.address != self.target else None
        if routes is not None and routes.failed(self.address, outcome):
            self.address = self.target
            return Resend(self.address)
        raise from_rpc_error(outcome)


def _deadline_exceeded(timeout: float) -> ShardqError:
    return ShardqError(
        grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:g} s; the job may still be committed"
    )


class BlockingEnqueueStream:
    """One EnqueueStream call of a ``Client``, shared by its threads: a thread of grpc's sends the
    requests as they are queued, one of the stream's own reads the answers and hands each to the
    thread waiting for it."""

    def __init__(self, method: Any, metadata: Sequence[tuple[str, str]] | None) -> None:
        """``method``: the address's ``JobServiceStub.EnqueueStream``."""
        self._requests: queue.SimpleQueue[pb.EnqueueStreamRequest | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[int, queue.SimpleQueue[Outcome]] = {}
        self._seq = 0
        self._ended: _Ending | grpc.RpcError | None = None
        self._call: Any = method(iter(self._requests.get, None), metadata=metadata)
        threading.Thread(target=self._read, name="shardq-enqueue-stream", daemon=True).start()

    def send(self, spec: pb.JobSpec, timeout: float) -> Outcome:
        answer: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        with self._lock:
            if self._ended is not None:
                return NotSent(self._ended)
            self._seq += 1
            seq = self._seq
            self._waiting[seq] = answer
        self._requests.put(pb.EnqueueStreamRequest(seq=seq, job=spec))
        try:
            return answer.get(timeout=timeout)
        except queue.Empty:
            with self._lock:
                if self._waiting.pop(seq, None) is None:  # answered just now
                    return answer.get_nowait()
            raise _deadline_exceeded(timeout) from None

    def close(self) -> None:
        with self._lock:
            if self._ended is None:
                self._ended = CANCELLED
        self._call.cancel()

    def _read(self) -> None:
        ending: _Ending | grpc.RpcError = ENDED
        try:
            for answer in self._call:
                if answer.closed:
                    ending = CLOSED
                    break
                with self._lock:
                    waiting = self._waiting.pop(answer.seq, None)
                if waiting is not None:
                    waiting.put(answer)
        except grpc.RpcError as exc:
            ending = exc
        with self._lock:
            if self._ended is CANCELLED:
                ending = CANCELLED
            self._ended = ending
            waiting_ones, self._waiting = self._waiting, {}
        for waiting in waiting_ones.values():
            waiting.put(ending)
        self._requests.put(None)  # grpc's sending thread ends with the request iterator
        self._call.cancel()  # after a ``closed``, the call is done: let grpc release it now


class AsyncEnqueueStream:
    """One EnqueueStream call of an ``AsyncClient``: its tasks write jobs one at a time, and a task
    of the stream's own reads the answers and resolves each job's future."""

    def __init__(self, method: Any, metadata: Sequence[tuple[str, str]] | None) -> None:
        """``method``: the address's ``JobServiceStub.EnqueueStream``."""
        self._call: Any = method(metadata=metadata)
        self._waiting: dict[int, asyncio.Future[Outcome]] = {}
        self._seq = 0
        self._writing = asyncio.Lock()  # grpc.aio takes one write at a time
        self._ended: _Ending | grpc.RpcError | None = None
        self._reader = asyncio.create_task(self._read(), name="shardq-enqueue-stream")

    async def send(self, spec: pb.JobSpec, timeout: float) -> Outcome:
        if self._ended is not None:
            return NotSent(self._ended)
        self._seq += 1
        seq = self._seq
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = answer
        try:
            async with asyncio.timeout(timeout):
                try:
                    async with self._writing:
                        await self._call.write(pb.EnqueueStreamRequest(seq=seq, job=spec))
                except (grpc.RpcError, asyncio.InvalidStateError):
                    pass  # the call has ended: the reader gives this job the stream's ending
                return await answer
        except TimeoutError:
            raise _deadline_exceeded(timeout) from None
        finally:
            self._waiting.pop(seq, None)

    async def close(self) -> None:
        if self._ended is None:
            self._ended = CANCELLED
        self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        ending: _Ending | grpc.RpcError = ENDED
        try:
            async for answer in self._call:
                if answer.closed:
                    ending = CLOSED
                    break
                waiting = self._waiting.pop(answer.seq, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except grpc.RpcError as exc:
            ending = exc
        except asyncio.CancelledError:
            ending = CANCELLED
        if self._ended is CANCELLED:
            ending = CANCELLED
        self._ended = ending
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_result(ending)
        self._waiting.clear()
        self._call.cancel()

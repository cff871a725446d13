"""Concurrent ``AsyncClient.enqueue`` calls share round trips.

The calls an application makes in the same turn of the event loop (a burst of producers, or tasks
that each enqueue one job) travel in one ``EnqueueMany`` per dispatcher they go to. Each call still
returns its own job id only once its job is committed, and fails with its own error: a batch the
dispatcher refuses as a whole (a bad job in it is refused with INVALID_ARGUMENT, a type outside the
token's scope with PERMISSION_DENIED; either way nothing was written) is sent again one job per call,
so one caller's bad job never fails another's. A call made alone goes as a plain ``Enqueue``.

One batch at a time is in flight to each dispatcher; calls made meanwhile wait to go together in
the next. Without that, batches to several dispatchers (whose answers come back at different times)
split into ever smaller ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from shardq_common.pb import shardq_pb2 as pb

from ._errors import ShardqError

MAX_BATCH = 1000
# Refusals of a whole batch that may be one job's fault: those jobs are sent again one by one.
_PER_JOB_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


class EnqueuePipeline:
    def __init__(
        self,
        enqueue_one: Callable[[pb.JobSpec, str], Awaitable[str]],
        enqueue_many: Callable[[list[pb.JobSpec], str], Awaitable[list[str]]],
    ) -> None:
        self._one = enqueue_one  # (spec, address)
        self._many = enqueue_many  # (specs, address)
        self._waiting: dict[str, list[tuple[pb.JobSpec, asyncio.Future[str]]]] = {}
        self._sending: dict[str, asyncio.Task[None]] = {}  # address -> the batch in flight there

    async def enqueue(self, spec: pb.JobSpec, address: str) -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        waiting = self._waiting.setdefault(address, [])
        waiting.append((spec, future))
        if address not in self._sending:
            if len(waiting) == 1:
                loop.call_soon(self._send, address)  # after the other calls of this turn of the loop
            elif len(waiting) >= MAX_BATCH:
                self._send(address)
        return await future

    def _send(self, address: str) -> None:
        waiting = self._waiting.get(address)
        if address in self._sending:
            return
        if not waiting:
            self._waiting.pop(address, None)  # no empty list left per owner address ever used
            return
        batch, self._waiting[address] = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
        task = self._sending[address] = asyncio.create_task(self._deliver(batch, address))
        task.add_done_callback(lambda _: self._sent(address))

    def _sent(self, address: str) -> None:
        del self._sending[address]
        self._send(address)  # what gathered meanwhile

    async def _deliver(self, batch: list[tuple[pb.JobSpec, asyncio.Future[str]]], address: str) -> None:
        if len(batch) == 1:
            await _settle(batch[0][1], self._one(batch[0][0], address))
            return
        try:
            ids = await self._many([spec for spec, _ in batch], address)
        except ShardqError as exc:
            if exc.code not in _PER_JOB_REFUSALS:
                for _, future in batch:
                    _fail(future, exc)
                return
            await asyncio.gather(*(_settle(future, self._one(spec, address)) for spec, future in batch))
            return
        except BaseException as exc:
            for _, future in batch:
                _fail(future, exc)
            raise
        for (_, future), job_id in zip(batch, ids, strict=True):
            if not future.done():
                future.set_result(job_id)


async def _settle(future: asyncio.Future[str], call: Awaitable[str]) -> None:
    try:
        result = await call
    except Exception as exc:
        _fail(future, exc)
    else:
        if not future.done():
            future.set_result(result)


def _fail(future: asyncio.Future[str], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

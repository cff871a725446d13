"""Concurrent ``AsyncClient.enqueue`` calls share round trips.

The calls an application makes in the same turn of the event loop (a burst of producers, or tasks
that each enqueue one job) travel in one ``EnqueueMany``. Each call still returns its own job id
only once its job is committed, and fails with its own error: a batch the dispatcher refuses as a
whole (a bad job in it is refused with INVALID_ARGUMENT, a type outside the token's scope with
PERMISSION_DENIED; either way nothing was written) is sent again one job per call, so one caller's
bad job never fails another's. A call made alone goes as a plain ``Enqueue``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from dispatcher._pb import shardq_pb2 as pb

from ._errors import ShardqError

MAX_BATCH = 1000
# Refusals of a whole batch that may be one job's fault: those jobs are sent again one by one.
_PER_JOB_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


class EnqueuePipeline:
    def __init__(
        self,
        enqueue_one: Callable[[pb.JobSpec], Awaitable[str]],
        enqueue_many: Callable[[list[pb.JobSpec]], Awaitable[list[str]]],
    ) -> None:
        self._one = enqueue_one
        self._many = enqueue_many
        self._waiting: list[tuple[pb.JobSpec, asyncio.Future[str]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def enqueue(self, spec: pb.JobSpec) -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        self._waiting.append((spec, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._send)  # after the other calls of this turn of the loop
        elif len(self._waiting) >= MAX_BATCH:
            self._send()
        return await future

    def _send(self) -> None:
        if not self._waiting:
            return
        batch, self._waiting = self._waiting, []
        task = asyncio.create_task(self._deliver(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, batch: list[tuple[pb.JobSpec, asyncio.Future[str]]]) -> None:
        if len(batch) == 1:
            await _settle(batch[0][1], self._one(batch[0][0]))
            return
        try:
            ids = await self._many([spec for spec, _ in batch])
        except ShardqError as exc:
            if exc.code not in _PER_JOB_REFUSALS:
                for _, future in batch:
                    _fail(future, exc)
                return
            await asyncio.gather(*(_settle(future, self._one(spec)) for spec, future in batch))
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

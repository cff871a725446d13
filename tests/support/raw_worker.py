"""A hand-driven worker stream, for tests that need to send exactly the messages they choose."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc


class RawWorker:
    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.call: Any = pb_grpc.WorkerServiceStub(self.channel).Connect()

    async def hello(
        self,
        worker_id: str,
        job_types: list[str],
        concurrency: int = 1,
        held: list[pb.LeaseRef] | None = None,
    ) -> pb.Welcome:
        await self.call.write(
            pb.WorkerMessage(
                hello=pb.Hello(
                    worker_id=worker_id, job_types=job_types, concurrency=concurrency, held=held or []
                )
            )
        )
        message = await self.read()
        assert message.WhichOneof("msg") == "welcome", message
        return message.welcome

    async def send(self, **kind: Any) -> None:
        await self.call.write(pb.WorkerMessage(**kind))

    async def credit(self, slots: int) -> None:
        await self.send(credit=pb.Credit(slots=slots))

    async def ack(self, ref: pb.LeaseRef) -> None:
        await self.send(acks=pb.Acks(acks=[pb.Ack(lease=ref)]))

    async def read(self, timeout: float = 10.0) -> pb.DispatcherMessage:
        async with asyncio.timeout(timeout):
            message = await self.call.read()
        assert message is not grpc.aio.EOF, "the dispatcher closed the stream"
        return message

    async def next_of(self, kind: str, timeout: float = 10.0) -> Any:
        """Read until a message of this kind arrives (others are skipped) and return its body."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.read(timeout)
                if message.WhichOneof("msg") == kind:
                    return getattr(message, kind)

    async def leases(self, count: int, timeout: float = 10.0) -> list[pb.Lease]:
        """Read until ``count`` leases have come (in one message or several); return them."""
        got: list[pb.Lease] = []
        while len(got) < count:
            got.extend((await self.next_of("leases", timeout)).leases)
        return got

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()

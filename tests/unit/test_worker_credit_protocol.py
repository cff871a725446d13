"""A worker grants the credit its results free inside the results' message only to a dispatcher
whose Welcome says protocol 2 or later; to an older one it sends a Credit message after them, which
is all that dispatcher reads (a credit it ignored would leave the worker idle with jobs ready).

The dispatcher here is a stand-in speaking the stream's protocol at a chosen version: an old
dispatcher cannot be started from this tree."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from worker_sdk import JobContext, Worker


class Dispatcher(pb_grpc.WorkerServiceServicer):
    """Welcomes at ``protocol``, hands out two leases, then records what the worker writes."""

    def __init__(self, protocol: int) -> None:
        self.protocol = protocol
        self.received: list[pb.WorkerMessage] = []
        self.acked = asyncio.Event()

    async def Connect(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        hello = await anext(aiter(request_iterator))
        assert hello.WhichOneof("msg") == "hello"
        yield pb.DispatcherMessage(welcome=pb.Welcome(dispatcher_id="d", protocol=self.protocol))
        leases = [
            pb.Lease(ref=pb.LeaseRef(job_id=f"j{n}", token=f"t{n}", shard=0), type="t", attempt=1,
                     max_attempts=5, lease_ttl_ms=60_000)
            for n in range(2)
        ]  # fmt: skip
        yield pb.DispatcherMessage(leases=pb.Leases(leases=leases))
        acked = 0
        async for message in request_iterator:
            self.received.append(message)
            acked += len(message.acks.acks)
            if acked == 2 and any(
                m.WhichOneof("msg") == "credit" or m.then_credit for m in self.received[-2:]
            ):
                self.acked.set()


@pytest.mark.parametrize("protocol", [1, 2])
async def test_results_carry_credit_only_to_a_dispatcher_that_reads_it(protocol):
    dispatcher = Dispatcher(protocol)
    server = grpc.aio.server()
    pb_grpc.add_WorkerServiceServicer_to_server(dispatcher, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def handler(ctx: JobContext) -> None:
        return None

    worker = Worker({"t": handler}, target=f"127.0.0.1:{port}", concurrency=2, handle_signals=False)
    try:
        async with worker:
            async with asyncio.timeout(10):
                await dispatcher.acked.wait()
    finally:
        await server.stop(0)
    received = dispatcher.received
    last_acks = max(i for i, m in enumerate(received) if m.WhichOneof("msg") == "acks")
    if protocol >= 2:
        assert received[last_acks].then_credit == 2, received
    else:
        assert not any(m.then_credit for m in received), received
        after = [m.credit.slots for m in received[last_acks + 1 :] if m.WhichOneof("msg") == "credit"]
        assert after == [2], received

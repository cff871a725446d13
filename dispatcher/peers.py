"""Channels to the other dispatchers, one per address, opened on first use."""

from __future__ import annotations

import grpc

from ._pb import shardq_pb2_grpc as pb_grpc


class Peers:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def shard_service(self, address: str) -> pb_grpc.ShardServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=[("grpc.max_send_message_length", 256 << 20)]
            )
        return pb_grpc.ShardServiceStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

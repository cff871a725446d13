"""Channels to the other dispatchers, one per address, opened on first use (TLS and the peer token
when the dispatcher is set up with them)."""

from __future__ import annotations

import grpc

from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity


class Peers:
    def __init__(self, security: ChannelSecurity | None = None) -> None:
        self.security = security or ChannelSecurity()
        #: Metadata for every call to a peer (the peer token, when auth is on).
        self.metadata = self.security.metadata
        self._channels: dict[str, grpc.aio.Channel] = {}

    def shard_service(self, address: str) -> pb_grpc.ShardServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self.security.aio_channel(
                address, options=[("grpc.max_send_message_length", 256 << 20)]
            )
        return pb_grpc.ShardServiceStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

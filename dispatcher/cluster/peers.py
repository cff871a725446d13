"""Channels to the other dispatchers, one per address, opened on first use (TLS and the peer token
when the dispatcher is set up with them), and closed once unused for a while: a peer that restarts
at a new address (a rescheduled pod) would otherwise leave a channel behind for the life of this
process."""

from __future__ import annotations

import asyncio
import time

import grpc

from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity

#: A channel no call has used for this long is closed. Every call to a peer has a deadline of a few
#: seconds (a hand-off: 5 s), so none is in flight on it by then.
IDLE_CLOSE_S = 600.0


class Peers:
    def __init__(self, security: ChannelSecurity | None = None, idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.security = security or ChannelSecurity()
        #: Metadata for every call to a peer (the peer token, when auth is on).
        self.metadata = self.security.metadata
        self.idle_close_s = idle_close_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._used: dict[str, float] = {}  # address -> when a call last took its channel (monotonic)
        self._next_sweep = time.monotonic() + idle_close_s
        self._closing: set[asyncio.Task[None]] = set()

    def shard_service(self, address: str) -> pb_grpc.ShardServiceStub:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._close_idle(now)
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self.security.aio_channel(
                address, options=[("grpc.max_send_message_length", 256 << 20)]
            )
        self._used[address] = now
        return pb_grpc.ShardServiceStub(channel)

    def _close_idle(self, now: float) -> None:
        self._next_sweep = now + self.idle_close_s
        for address, used in list(self._used.items()):
            if now - used >= self.idle_close_s:
                del self._used[address]
                task = asyncio.ensure_future(self._channels.pop(address).close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def open_addresses(self) -> list[str]:
        return sorted(self._channels)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._used.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

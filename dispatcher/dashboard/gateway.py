"""The dashboard's way to the dispatchers: one SDK client per (address, token), kept while in use.

Every call carries the signed-in user's own token, so the dispatcher applies that user's role and
job-type scope; the dashboard holds no power of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict

from worker_sdk import AsyncClient

#: Clients kept open (one channel each): signed-in users times dispatcher processes.
MAX_CLIENTS = 64
CALL_TIMEOUT_S = 10.0


class Gateway:
    def __init__(self, target: str | None, *, timeout: float = CALL_TIMEOUT_S) -> None:
        self.target = target
        self.timeout = timeout
        self._clients: OrderedDict[tuple[str, bytes], AsyncClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def client(self, token: str, address: str | None = None) -> AsyncClient:
        """The client that calls ``address`` (default: the target) with ``token``."""
        address = address or self.target or ""
        key = (address, hashlib.sha256(token.encode()).digest())
        client = self._clients.get(key)
        if client is None:
            client = AsyncClient(address or None, token=token or None, timeout=self.timeout)
            self._clients[key] = client
            while len(self._clients) > MAX_CLIENTS:
                _, old = self._clients.popitem(last=False)
                task = asyncio.ensure_future(old.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        else:
            self._clients.move_to_end(key)
        return client

    def reset(self) -> None:
        """Drop every client: the next calls open new channels. After UNAVAILABLE, a channel waits
        out gRPC's reconnect backoff (up to two minutes) before it tries again, so a dispatcher
        back from a restart would stay unreachable that long through the old one."""
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            task = asyncio.ensure_future(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

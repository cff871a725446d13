"""The dashboard's way to the dispatchers: one SDK client per (address, token), kept while in use.

Every call carries the signed-in user's own token, so the dispatcher applies that user's role and
job-type scope; the dashboard holds no power of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict

from worker_sdk import AsyncClient, Identity

#: Clients kept open (one channel each): signed-in users times dispatcher processes.
MAX_CLIENTS = 64
CALL_TIMEOUT_S = 10.0
#: A client pushed out of the cache is closed this long after, once the calls it carries are over
#: (closing its channel at once would cancel them).
RETIRE_S = 6 * CALL_TIMEOUT_S


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
                task = asyncio.ensure_future(self._retire(old))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        else:
            self._clients.move_to_end(key)
        return client

    def reset(self) -> None:
        """Drop every client: the next calls open new channels. After UNAVAILABLE, a channel waits
        out gRPC's reconnect backoff (up to two minutes) before it tries again, so a dispatcher
        back from a restart would stay unreachable that long through the old one. The old clients
        are retired as evicted ones are: calls they still carry finish first."""
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            task = asyncio.ensure_future(self._retire(client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def verify(self, token: str) -> Identity:
        """Who ``token`` stands for, asked with a client made for this one call: a token the
        dispatcher refuses never takes a place among the kept clients."""
        key = (self.target or "", hashlib.sha256(token.encode()).digest())
        kept = self._clients.get(key)
        if kept is not None:
            return await kept.whoami()
        async with AsyncClient(self.target, token=token or None, timeout=self.timeout) as once:
            return await once.whoami()

    async def _retire(self, client: AsyncClient) -> None:
        try:
            await asyncio.sleep(RETIRE_S)
        finally:
            await client.close()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()
        for task in self._closing:
            task.cancel()  # closes its client now
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

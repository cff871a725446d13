"""A private redis-server per system, so no system sees another's keys or memory."""

from __future__ import annotations

import asyncio

import redis

from dispatcher.ops.embedded import EmbeddedRedis


class PrivateRedis:
    def __init__(self) -> None:
        self._server = EmbeddedRedis()
        self.client: redis.Redis | None = None

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> PrivateRedis:
        asyncio.run(self._server.start())
        self.client = redis.Redis.from_url(self.url)
        return self

    def _redis(self) -> redis.Redis:
        assert self.client is not None, "start() first"
        return self.client

    def flush(self) -> None:
        self._redis().flushall()

    def used_memory(self) -> int:
        """used_memory less the clients' buffers: a connection's query and output buffers grow with
        its last large command or reply and shrink only after it idles a while, so they swing by a
        megabyte across a fill of a few thousand jobs (more connections each doing start-up work
        make it worse) and are no cost of a pending job."""
        memory = self._redis().info("memory")
        return int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))

    def version(self) -> str:
        return str(self._redis().info("server")["redis_version"])

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self._server.stop()

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
        return int(self._redis().info("memory")["used_memory"])

    def version(self) -> str:
        return str(self._redis().info("server")["redis_version"])

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self._server.stop()

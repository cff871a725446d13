"""A TCP forwarder on a loopback port whose upstream a test can move: the stand-in for an address
that follows the Redis master (a virtual IP, a DNS name, a proxy) across a failover."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from .ports import free_port

HOST = "127.0.0.1"


class TcpProxy:
    """Forwards every connection on ``port`` to ``127.0.0.1:upstream_port``. ``repoint()`` sends the
    new connections elsewhere; with ``cut`` the open ones are closed too (the old master is gone),
    without it they stay on the old upstream (an old master that was demoted, still answering)."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port(HOST)
        self.upstream_port = upstream_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def repoint(self, upstream_port: int, *, cut: bool = True) -> None:
        self._call(self._repoint(upstream_port, cut))

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)

    async def _repoint(self, upstream_port: int, cut: bool) -> None:
        self.upstream_port = upstream_port
        if cut:
            for writer in list(self._links):
                writer.close()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._links):
            writer.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(HOST, self.upstream_port)
        except OSError:
            client_writer.close()
            return
        pair = {client_writer, upstream_writer}
        self._links |= pair
        try:
            await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))
        finally:
            self._links -= pair
            for writer in pair:
                writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        writer.close()

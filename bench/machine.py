"""The machine a run measured: CPU, cores, memory, OS and the versions of the shared tools."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_info() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "node": _version(["node", "--version"]),
    }


def shardq_source() -> dict[str, Any]:
    """Which shardq code was measured: the commit, and whether its sources had uncommitted changes.
    A copy without .git (e.g. from git archive) names its commit in BENCH_SOURCE_COMMIT."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.environ.get("BENCH_SOURCE_COMMIT"):
        return {"commit": os.environ["BENCH_SOURCE_COMMIT"], "uncommitted_changes": False}
    commit = _version(["git", "-C", root, "rev-parse", "HEAD"])
    sources = ["dispatcher", "worker_sdk", "shardmap"]
    changes = _version(["git", "-C", root, "status", "--porcelain", "--", *sources])
    return {"commit": commit, "uncommitted_changes": bool(changes)}

"""Runs one action of a system's driver in that system's environment and reads its JSON answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "  # the same marker bench.peers._driver and the Node driver print


class DriverError(RuntimeError):
    """A driver failed or gave no answer; the message holds the end of its log."""


def call_driver(
    argv: list[str], action: str, params: dict[str, Any], env: dict[str, str], log: Path, timeout: float
) -> dict[str, Any]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        err.write(f"\n=== {action} {json.dumps(params)}\n".encode())
        err.flush()
        try:
            done = subprocess.run(
                [*argv, action, json.dumps(params)], env=env, stdout=subprocess.PIPE, stderr=err,
                timeout=timeout, cwd=Path(__file__).resolve().parents[1],
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise DriverError(f"{action} did not finish within {timeout:.0f} s:\n{_tail(log)}") from None
    for line in reversed(done.stdout.decode(errors="replace").splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result
    raise DriverError(f"{action} exited with {done.returncode} and no result:\n{_tail(log)}")


def _tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

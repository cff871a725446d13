"""Named crash points for fault-injection tests: SHARDQ_FAILPOINTS=name[,name...] makes the process
exit at once (no clean-up, like SIGKILL) when it reaches one. Unset in production: one dict lookup."""

from __future__ import annotations

import os

_ARMED = frozenset(filter(None, os.environ.get("SHARDQ_FAILPOINTS", "").split(",")))
CRASH_EXIT_CODE = 86


def hit(name: str) -> None:
    if name in _ARMED:
        os.write(2, f"failpoint {name}: exiting\n".encode())
        os._exit(CRASH_EXIT_CODE)

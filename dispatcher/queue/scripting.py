"""Load the Lua scripts once, inlining ``--- @include "name"`` lines from scripts/includes/.

The include ``codes`` is not a file: it is rendered here from the enums of states.py, so a script
names a state or a result code (``STATE.LEASED``, ``CANCEL.RUNNING``) with the value Python reads.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from .states import (
    ACTIVE,
    TERMINAL,
    AckCode,
    AcquireCode,
    CancelCode,
    DeadReason,
    EnqueueCode,
    EpochCode,
    ExtendCode,
    FenceCode,
    JobState,
    PeekCode,
    RetryCode,
    ReturnCode,
)

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.M)
SCRIPT_NAMES = (
    "enqueue",
    "peek_due",
    "promote_delayed",
    "lease",
    "extend_lease",
    "shorten_lease",
    "return_leases",
    "ack",
    "retry",
    "reap_leases",
    "cancel",
    "restore_jobs",
    "forget_jobs",
    "missing_jobs",
    "note_unpushed",
    "finished_jobs",
    "forget_types",
    "run_now",
    "acquire_shard",
    "renew_shard",
    "release_shard",
)


# The Lua table of each result-code enum.
LUA_CODE_TABLES = {
    "FENCE": FenceCode,
    "ENQUEUE": EnqueueCode,
    "PEEK": PeekCode,
    "ACK": AckCode,
    "EXTEND": ExtendCode,
    "RETRY": RetryCode,
    "RETURN": ReturnCode,
    "CANCEL": CancelCode,
    "ACQUIRE": AcquireCode,
    "EPOCH": EpochCode,
}


def _lua_set(states: frozenset[JobState]) -> str:
    return "{" + ", ".join(f"['{s.value}'] = true" for s in JobState if s in states) + "}"


def codes_include() -> str:
    """The ``codes`` include: the states, dead-letter reasons and result codes as Lua tables."""
    lines = ["-- Rendered from dispatcher/queue/states.py when the scripts load."]
    for table, strings in (("STATE", JobState), ("REASON", DeadReason)):
        lines.append(f"local {table} = {{" + ", ".join(f"{m.name} = '{m.value}'" for m in strings) + "}")
    lines.append(f"local ACTIVE = {_lua_set(ACTIVE)}")
    lines.append(f"local TERMINAL = {_lua_set(TERMINAL)}")
    for table, codes in LUA_CODE_TABLES.items():
        members = ", ".join(f"{name} = {int(m)}" for name, m in codes.__members__.items())
        lines.append(f"local {table} = {{{members}}}")
    return "\n".join(lines) + "\n"


@cache
def script_source(name: str) -> str:
    root = resources.files("dispatcher.queue") / "scripts"
    included: set[str] = set()

    def include(match: re.Match[str]) -> str:
        """An include's text, its own includes inlined first; each goes in once per script."""
        part = match.group(1)
        if part in included:
            return ""
        included.add(part)
        if part == "codes":
            return codes_include()
        return _INCLUDE.sub(include, (root / "includes" / f"{part}.lua").read_text())

    return _INCLUDE.sub(include, (root / f"{name}.lua").read_text())


class Scripts:
    """One registered script per transition; each call runs EVALSHA and reloads on NOSCRIPT."""

    def __init__(self, redis: Any) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, redis.register_script(script_source(name)))

    enqueue: Any
    peek_due: Any
    promote_delayed: Any
    lease: Any
    extend_lease: Any
    shorten_lease: Any
    return_leases: Any
    ack: Any
    retry: Any
    reap_leases: Any
    cancel: Any
    restore_jobs: Any
    forget_jobs: Any
    missing_jobs: Any
    note_unpushed: Any
    finished_jobs: Any
    acquire_shard: Any
    renew_shard: Any
    release_shard: Any

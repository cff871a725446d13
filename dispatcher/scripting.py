"""Load the Lua scripts once, inlining ``--- @include "name"`` lines from scripts/includes/."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

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
    "finished_jobs",
    "acquire_shard",
    "renew_shard",
    "release_shard",
)


@cache
def script_source(name: str) -> str:
    root = resources.files("dispatcher") / "scripts"
    text = (root / f"{name}.lua").read_text()

    def include(match: re.Match[str]) -> str:
        return (root / "includes" / f"{match.group(1)}.lua").read_text()

    return _INCLUDE.sub(include, text)


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
    finished_jobs: Any
    acquire_shard: Any
    renew_shard: Any
    release_shard: Any

"""Queue settings declared in a TOML file (SHARDQ_QUEUES_FILE), set when a dispatcher starts, so a
deploy declares its limits next to its code. One table per job type; each key given sets that
setting, a key left out keeps what the DB holds (a pause made from the command line survives a
restart unless the file says ``paused``):

    [queues."mail.send"]
    paused = false                    # true: every class; or a list of classes: ["low"]
    concurrency = 20                  # most running at once, cluster-wide (0: no limit)
    key_concurrency = 2               # most running at once per concurrency key (0: no limit)
    key_concurrency_overrides = { "big-tenant" = 10 }
    key_weights = { "big-tenant" = 3 }  # its share of leases among keys (default 1)
    rate = "100/s"                    # a token bucket: N/s, N/m or N/h ("" or "none": no limit)
    burst = 20                        # tokens saved up (default 1)
    key_rate = "5/s"                  # the same per concurrency key
    key_burst = 5
    retain_finished = "3d"            # keep succeeded and cancelled jobs' rows this long (retention)
    retain_dead = "90d"               # keep dead-lettered jobs' rows this long
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from shardq_common.durations import parse_duration_ms
from shardq_common.errors import ConfigError, InvalidArgument

from .flow import ALL_CLASSES, QueueSettings, Rate
from .rates import parse_rate
from .states import Priority
from .validation import job_type as check_job_type

_KEYS = {
    "paused",
    "concurrency",
    "key_concurrency",
    "key_concurrency_overrides",
    "key_weights",
    "rate",
    "burst",
    "key_rate",
    "key_burst",
    "retain_finished",
    "retain_dead",
}


def load(path: str) -> dict[str, tuple[QueueSettings, list[str]]]:
    """type -> (the settings the file gives, the names of the fields it gives); ConfigError naming
    the entry for a malformed one (the values' bounds are checked when they are set)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"SHARDQ_QUEUES_FILE {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"SHARDQ_QUEUES_FILE {path}: not TOML: {exc}") from None
    unknown_top = set(data) - {"queues"}
    if unknown_top:
        raise ConfigError(
            f"SHARDQ_QUEUES_FILE {path}: unknown table(s) {sorted(unknown_top)}; use [queues.TYPE]"
        )
    queues = data.get("queues", {})
    if not isinstance(queues, dict) or not all(isinstance(v, dict) for v in queues.values()):
        raise ConfigError(f"SHARDQ_QUEUES_FILE {path}: write each queue as a [queues.TYPE] table")
    return {
        job_type: _entry(job_type, entry, f"{path}: [queues.{job_type}]")
        for job_type, entry in queues.items()
    }


def _entry(job_type: str, entry: dict[str, Any], where: str) -> tuple[QueueSettings, list[str]]:
    try:
        check_job_type(job_type, "type")
    except InvalidArgument as exc:
        raise ConfigError(f"{where}: {exc}") from None
    unknown = set(entry) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    if "burst" in entry and "rate" not in entry or "key_burst" in entry and "key_rate" not in entry:
        raise ConfigError(
            f"{where}: a burst goes with its rate (give rate with burst, key_rate with key_burst)"
        )
    values: dict[str, Any] = {}
    try:
        if "paused" in entry:
            values["paused"] = _paused(entry["paused"])
        for name in ("concurrency", "key_concurrency"):
            if name in entry:
                values[name] = _int(entry[name], name)
        for name in ("key_concurrency_overrides", "key_weights"):
            if name in entry:
                if not isinstance(entry[name], dict):
                    raise ValueError(f"{name}: write a table of key = number")
                values[name] = {str(k): _int(v, f"{name}.{k}") for k, v in entry[name].items()}
        for name, burst in (("rate", "burst"), ("key_rate", "key_burst")):
            if name in entry:
                per_s = parse_rate(str(entry[name]))
                values[name] = None if per_s is None else Rate(per_s, _int(entry.get(burst, 1), burst))
        for key, name in (("retain_finished", "retain_finished_s"), ("retain_dead", "retain_dead_s")):
            if key in entry:
                text = str(entry[key])
                try:
                    values[name] = 0 if text == "default" else parse_duration_ms(text) // 1000
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return QueueSettings(job_type, **values), list(values)


def _paused(value: Any) -> frozenset[Priority]:
    if isinstance(value, bool):
        return ALL_CLASSES if value else frozenset()
    if isinstance(value, list):
        try:
            return frozenset(Priority.parse(str(v)) for v in value)
        except (KeyError, ValueError):
            pass
    raise ValueError(f"paused: {value!r}: write true, false or a list of classes (high, default, low)")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: {value!r} is not a whole number")
    return value


def check(path: str | None) -> None:
    """Refuse to start on a bad queues file before any process is spawned."""
    if not path:
        return
    from .flow import validated

    for job_type, (given, _) in load(path).items():
        try:
            validated(given)
        except InvalidArgument as exc:
            raise ConfigError(f"{path}: [queues.{job_type}] {exc}") from None

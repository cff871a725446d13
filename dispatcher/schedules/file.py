"""Schedules declared in a TOML file (SHARDQ_SCHEDULES_FILE), upserted when a dispatcher starts, so a
deploy declares its schedules next to its code. Upserting an unchanged schedule does nothing.

    [[schedule]]
    name = "nightly-report"
    cron = "30 2 * * *"
    type = "reports.nightly"
    timezone = "Europe/Berlin"      # default UTC
    payload = { format = "pdf" }    # any TOML value, sent as JSON
    max_lag = "2h"                  # default 1h
    catch_up = "latest"             # all | latest | none
    priority = "default"            # high | default | low
    max_attempts = 3
    enabled = true                  # omit to keep an existing schedule's paused/running state
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from shardq_common.durations import parse_duration_ms
from shardq_common.errors import ConfigError, InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

from ..config import Settings
from .spec import schedule_spec

_KEYS = {
    "name",
    "cron",
    "type",
    "timezone",
    "payload",
    "max_lag",
    "catch_up",
    "priority",
    "max_attempts",
    "lease_ttl",
    "enabled",
}
_CATCH_UP = {"all": pb.CATCH_UP_ALL, "latest": pb.CATCH_UP_LATEST, "none": pb.CATCH_UP_NONE}
_PRIORITY = {"high": pb.PRIORITY_HIGH, "default": pb.PRIORITY_DEFAULT, "low": pb.PRIORITY_LOW}


def load(path: str) -> list[pb.ScheduleSpec]:
    """The file's schedules as specs (checked in full by the upsert); ConfigError naming the entry."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"SHARDQ_SCHEDULES_FILE {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"SHARDQ_SCHEDULES_FILE {path}: not TOML: {exc}") from None
    unknown_top = set(data) - {"schedule"}
    if unknown_top:
        raise ConfigError(
            f"SHARDQ_SCHEDULES_FILE {path}: unknown table(s) {sorted(unknown_top)}; use [[schedule]]"
        )
    entries = data.get("schedule", [])
    if not isinstance(entries, list):
        raise ConfigError(f"SHARDQ_SCHEDULES_FILE {path}: write each schedule as a [[schedule]] table")
    return [_spec(entry, f"{path}: schedule #{i + 1}") for i, entry in enumerate(entries)]


def _spec(entry: dict[str, Any], where: str) -> pb.ScheduleSpec:
    unknown = set(entry) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    for key in ("name", "cron", "type"):
        if not isinstance(entry.get(key), str):
            raise ConfigError(f"{where}: {key} is required (a string)")
    try:
        spec = pb.ScheduleSpec(
            name=entry["name"],
            cron=entry["cron"],
            type=entry["type"],
            timezone=str(entry.get("timezone", "UTC")),
            payload=b""
            if "payload" not in entry
            else json.dumps(entry["payload"], separators=(",", ":")).encode(),
            catch_up=_CATCH_UP[entry.get("catch_up", "latest")],
            priority=_PRIORITY[entry.get("priority", "default")],
            max_lag_ms=parse_duration_ms(str(entry.get("max_lag", "1h"))),
        )
        if "max_attempts" in entry:
            spec.max_attempts = int(entry["max_attempts"])
        if "lease_ttl" in entry:
            spec.lease_ttl_ms = parse_duration_ms(str(entry["lease_ttl"]))
        if "enabled" in entry:
            spec.enabled = bool(entry["enabled"])
    except KeyError as exc:
        raise ConfigError(f"{where}: unknown value {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return spec


def check(settings: Settings) -> None:
    """Refuse to start on a bad schedules file, before any process is spawned (a supervisor would
    otherwise restart its children forever on an error no restart can fix)."""
    if not settings.schedules_file:
        return
    for i, spec in enumerate(load(settings.schedules_file)):
        try:
            schedule_spec(spec, settings, f"{settings.schedules_file}: schedule #{i + 1}")
        except InvalidArgument as exc:
            raise ConfigError(str(exc)) from None

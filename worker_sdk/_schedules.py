"""Schedules as Python values: ``Schedule`` declares one, ``ScheduleInfo`` is one as stored."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shardq_common.pb import shardq_pb2 as pb

from ._convert import PRIORITIES, PRIORITY_NAMES, encode_payload

CATCH_UP = {"all": pb.CATCH_UP_ALL, "latest": pb.CATCH_UP_LATEST, "none": pb.CATCH_UP_NONE}
CATCH_UP_NAMES = {v: k for k, v in CATCH_UP.items()}


@dataclass(frozen=True)
class Schedule:
    """A recurring job: `job_type` runs with `payload` at every occurrence of `cron` in `timezone`.

    cron: 5 fields, 6 with a leading seconds field, or an alias such as "@hourly".
    max_lag: seconds (or a timedelta); missed occurrences older than this are never run.
    catch_up: what runs of the occurrences missed while no scheduler ran: "all" (within max_lag),
    "latest" (the most recent one, if within max_lag) or "none".
    enabled: None keeps an existing schedule's paused/running state (a new one runs).
    """

    name: str
    cron: str
    job_type: str
    payload: Any = None
    timezone: str = "UTC"
    max_lag: float | timedelta = 3600.0
    catch_up: str = "latest"
    priority: str = "default"
    max_attempts: int | None = None
    lease_ttl: float | timedelta | None = None
    enabled: bool | None = None

    def to_pb(self) -> pb.ScheduleSpec:
        if self.catch_up not in CATCH_UP:
            raise ValueError(f"unknown catch_up {self.catch_up!r}: use all, latest or none")
        if self.priority not in PRIORITIES:
            raise ValueError(f"unknown priority {self.priority!r}: use high, default or low")
        spec = pb.ScheduleSpec(
            name=self.name,
            cron=self.cron,
            type=self.job_type,
            payload=encode_payload(self.payload),
            priority=PRIORITIES[self.priority],
            timezone=self.timezone,
            max_lag_ms=_ms(self.max_lag),
            catch_up=CATCH_UP[self.catch_up],
        )
        if self.max_attempts is not None:
            spec.max_attempts = self.max_attempts
        if self.lease_ttl is not None:
            spec.lease_ttl_ms = _ms(self.lease_ttl)
        if self.enabled is not None:
            spec.enabled = self.enabled
        return spec


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    cron: str
    job_type: str
    payload: bytes
    timezone: str
    max_lag_ms: int
    catch_up: str
    priority: str
    max_attempts: int
    lease_ttl_ms: int
    enabled: bool
    version: int
    shard: int
    last_occurrence_ms: int
    next_occurrence_ms: int
    materialized: int
    skipped: int
    created_at_ms: int
    updated_at_ms: int

    @classmethod
    def from_pb(cls, s: pb.Schedule) -> ScheduleInfo:
        spec = s.spec
        return cls(
            name=spec.name,
            cron=spec.cron,
            job_type=spec.type,
            payload=spec.payload,
            timezone=spec.timezone,
            max_lag_ms=spec.max_lag_ms,
            catch_up=CATCH_UP_NAMES.get(spec.catch_up, "latest"),
            priority=PRIORITY_NAMES.get(spec.priority, "default"),
            max_attempts=spec.max_attempts,
            lease_ttl_ms=spec.lease_ttl_ms,
            enabled=s.enabled,
            version=s.version,
            shard=s.shard,
            last_occurrence_ms=s.last_occurrence_ms,
            next_occurrence_ms=s.next_occurrence_ms,
            materialized=s.materialized,
            skipped=s.skipped,
            created_at_ms=s.created_at_ms,
            updated_at_ms=s.updated_at_ms,
        )


def schedule_from(schedule: Schedule | None, fields: dict[str, Any]) -> pb.ScheduleSpec:
    return (schedule or Schedule(**fields)).to_pb()


def _ms(value: float | timedelta) -> int:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError("durations must not be negative")
    return math.ceil(seconds * 1000)

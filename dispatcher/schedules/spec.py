"""Check a ScheduleSpec before anything is written; errors name the field and the problem."""

from __future__ import annotations

import structlog

from shardmap import shard_for
from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

from ..config import Settings
from ..queue import validation
from ..store import ScheduleRow
from .catch_up import CatchUp
from .cron import Cron, CronError

log = structlog.get_logger("shardq.schedules")
DEFAULT_MAX_LAG_MS = 3_600_000
MIN_MAX_LAG_MS = 1_000
MAX_MAX_LAG_MS = 30 * 86_400_000
CATCH_UP_FROM_PB = {
    pb.CATCH_UP_UNSPECIFIED: CatchUp.LATEST,
    pb.CATCH_UP_ALL: CatchUp.ALL,
    pb.CATCH_UP_LATEST: CatchUp.LATEST,
    pb.CATCH_UP_NONE: CatchUp.NONE,
}
CATCH_UP_TO_PB = {v: k for k, v in CATCH_UP_FROM_PB.items() if k != pb.CATCH_UP_UNSPECIFIED}


def schedule_name(value: str, field: str = "name") -> str:
    if not value:
        raise InvalidArgument(f"{field}: must not be empty")
    if not validation.TYPE_PATTERN.fullmatch(value):
        raise InvalidArgument(
            f"{field}: {value[:60]!r} is not a schedule name: 1..200 characters of letters, digits and "
            "_.:/-, starting with a letter or digit"
        )
    return value


def schedule_spec(
    spec: pb.ScheduleSpec, settings: Settings, field: str = "schedule"
) -> tuple[ScheduleRow, bool | None]:
    """The row the spec asks for (its counters and cursor still blank), and the enabled flag it
    sets (None: unset, keep the current one)."""
    name = schedule_name(spec.name, f"{field}.name")
    try:
        cron = Cron.parse(spec.cron, spec.timezone or "UTC")
    except CronError as exc:
        part = "timezone" if "time zone" in str(exc) else "cron"
        raise InvalidArgument(f"{field}.{part}: {exc}") from None
    job = validation.job_spec(
        pb.JobSpec(
            type=spec.type,
            payload=spec.payload,
            priority=spec.priority,
            max_attempts=spec.max_attempts if spec.HasField("max_attempts") else None,
            lease_ttl_ms=spec.lease_ttl_ms if spec.HasField("lease_ttl_ms") else None,
        ),
        field,
        settings,
        0,
    )
    max_lag = spec.max_lag_ms if spec.HasField("max_lag_ms") else DEFAULT_MAX_LAG_MS
    if not MIN_MAX_LAG_MS <= max_lag <= MAX_MAX_LAG_MS:
        raise InvalidArgument(
            f"{field}.max_lag_ms: {max_lag} ms is not a max lag: it must be in "
            f"{MIN_MAX_LAG_MS}..{MAX_MAX_LAG_MS} (1 s to 30 days)"
        )
    if spec.catch_up not in CATCH_UP_FROM_PB:
        raise InvalidArgument(f"{field}.catch_up: unknown catch-up policy {spec.catch_up}")
    row = ScheduleRow(
        name=name,
        cron=cron.expression,
        timezone=cron.zone_name,
        type=job.type,
        shard=shard_for(job.type, settings.shard_count),
        payload=job.payload,
        priority=int(job.priority),
        max_attempts=job.max_attempts,
        lease_ttl_ms=job.lease_ttl_ms,
        max_lag_ms=max_lag,
        catch_up=str(CATCH_UP_FROM_PB[spec.catch_up]),
        enabled=True,
    )
    return row, spec.enabled if spec.HasField("enabled") else None


def to_pb(row: ScheduleRow) -> pb.Schedule:
    return pb.Schedule(
        spec=pb.ScheduleSpec(
            name=row.name,
            cron=row.cron,
            type=row.type,
            payload=row.payload,
            priority=validation.priority_to_pb(row.priority),
            timezone=row.timezone,
            max_lag_ms=row.max_lag_ms,
            catch_up=CATCH_UP_TO_PB[CatchUp(row.catch_up)],
            max_attempts=row.max_attempts,
            lease_ttl_ms=row.lease_ttl_ms,
            enabled=row.enabled,
        ),
        enabled=row.enabled,
        version=row.version,
        shard=row.shard,
        last_occurrence_ms=row.last_occurrence_ms or 0,
        next_occurrence_ms=(row.next_occurrence_ms or 0) if row.enabled else 0,
        materialized=row.materialized,
        skipped=row.skipped,
        created_at_ms=row.created_at,
        updated_at_ms=row.updated_at,
    )


def log_change(row: ScheduleRow, what: str) -> None:
    log.info(
        f"schedule {what}",
        schedule=row.name,
        cron=row.cron,
        tz=row.timezone,
        type=row.type,
        version=row.version,
        enabled=row.enabled,
    )

"""``dispatcherctl schedule ...``: recurring jobs from the shell."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shardq_common.durations import parse_duration_ms
from worker_sdk import Client, Schedule, ScheduleInfo

from .tables import table


class ScheduleUsageError(ValueError):
    pass


def _when(ms: int, zone: str = "UTC") -> str:
    if not ms:
        return "-"
    try:
        tz: Any = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = UTC
    return datetime.fromtimestamp(ms / 1000, tz=tz).isoformat(timespec="seconds")


def _json(info: ScheduleInfo) -> dict[str, Any]:
    data = asdict(info)
    data["payload"] = info.payload.decode(errors="replace")
    return data


def _rows(info: ScheduleInfo) -> list[tuple[str, Any]]:
    return [
        ("name", info.name),
        ("cron", info.cron),
        ("timezone", info.timezone),
        ("type", info.job_type),
        ("state", "running" if info.enabled else "paused"),
        ("catch_up", f"{info.catch_up} (max lag {info.max_lag_ms / 1000:g}s)"),
        ("priority", info.priority),
        ("max_attempts", info.max_attempts),
        ("last_occurrence", _when(info.last_occurrence_ms, info.timezone)),
        ("next_occurrence", _when(info.next_occurrence_ms, info.timezone)),
        ("materialized", info.materialized),
        ("skipped", info.skipped),
        ("version", info.version),
        ("shard", info.shard),
        ("payload", info.payload.decode(errors="replace") or "-"),
    ]


def cmd_add(client: Client, args: argparse.Namespace) -> Any:
    payload = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except json.JSONDecodeError as exc:
            raise ScheduleUsageError(
                f"--payload is not valid JSON: {exc.msg} at position {exc.pos}"
            ) from None
    try:
        max_lag_ms = parse_duration_ms(args.max_lag)
    except ValueError as exc:
        raise ScheduleUsageError(f"--max-lag: {exc}") from None
    schedule = Schedule(
        name=args.name,
        cron=args.cron,
        job_type=args.type,
        payload=payload,
        timezone=args.tz,
        max_lag=max_lag_ms / 1000,
        catch_up=args.catch_up,
        priority=args.priority,
        max_attempts=args.max_attempts,
    )
    info, changed = client.upsert_schedule(schedule)
    head = f"schedule {info.name} {'saved' if changed else 'unchanged (already exactly so)'}"
    return {**_json(info), "changed": changed}, head + "\n" + table(["field", "value"], _rows(info))


def cmd_list(client: Client, args: argparse.Namespace) -> Any:
    found = client.schedules(args.type or "")
    rows = [
        (
            s.name,
            s.cron,
            s.timezone,
            s.job_type,
            "running" if s.enabled else "paused",
            _when(s.next_occurrence_ms, s.timezone),
            s.materialized,
            s.skipped,
        )
        for s in found
    ]
    headers = ["name", "cron", "timezone", "type", "state", "next", "materialized", "skipped"]
    return [_json(s) for s in found], table(headers, rows) if rows else "no schedules"


def cmd_show(client: Client, args: argparse.Namespace) -> Any:
    info = client.get_schedule(args.name)
    return _json(info), table(["field", "value"], _rows(info))


def cmd_pause(client: Client, args: argparse.Namespace) -> Any:
    info = client.pause_schedule(args.name)
    return _json(info), f"schedule {info.name} paused: no occurrence runs until it is resumed"


def cmd_resume(client: Client, args: argparse.Namespace) -> Any:
    info = client.resume_schedule(args.name)
    return _json(info), f"schedule {info.name} resumed: it runs from now on (paused occurrences do not)"


def cmd_rm(client: Client, args: argparse.Namespace) -> Any:
    client.delete_schedule(args.name)
    return {"deleted": args.name}, f"schedule {args.name} deleted; its future occurrences are cancelled"


def cmd_next(client: Client, args: argparse.Namespace) -> Any:
    if not 1 <= args.count <= 1000:
        raise ScheduleUsageError("--count must be in 1..1000")
    occurrences, zone = client.next_occurrences(args.name, args.count)
    rows = [(_when(ms, zone), _when(ms)) for ms in occurrences]
    data = {"timezone": zone, "occurrences_ms": occurrences}
    return data, table([f"local ({zone})", "UTC"], rows) if rows else "no coming occurrence"


def add_commands(sub: Any) -> None:
    schedule = sub.add_parser("schedule", help="recurring jobs (cron)").add_subparsers(
        dest="schedule_command", required=True
    )
    p = schedule.add_parser("add", help="create or replace a schedule (same name: upsert)")
    p.add_argument("name")
    p.add_argument("--cron", required=True, help='5 fields, 6 with leading seconds, or "@hourly"-style')
    p.add_argument("--type", required=True, help="the job type each occurrence runs as")
    p.add_argument("--payload", help="JSON payload")
    p.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    p.add_argument(
        "--max-lag", default="1h", help="missed occurrences older than this never run (default 1h)"
    )
    p.add_argument("--catch-up", choices=["all", "latest", "none"], default="latest")
    p.add_argument("--priority", choices=["high", "default", "low"], default="default")
    p.add_argument("--max-attempts", type=int)
    p.set_defaults(func=cmd_add)
    p = schedule.add_parser("list", help="every schedule")
    p.add_argument("--type", help="only schedules of this job type")
    p.set_defaults(func=cmd_list)
    for name, func, help_text in (
        ("show", cmd_show, "one schedule in full"),
        ("pause", cmd_pause, "stop materializing occurrences"),
        ("resume", cmd_resume, "materialize occurrences again, from now"),
        ("rm", cmd_rm, "delete a schedule and cancel its future occurrences"),
    ):
        p = schedule.add_parser(name, help=help_text)
        p.add_argument("name")
        p.set_defaults(func=func)
    p = schedule.add_parser("next", help="the coming occurrences, in the schedule's zone and in UTC")
    p.add_argument("name")
    p.add_argument("--count", type=int, default=5)
    p.set_defaults(func=cmd_next)

"""``dispatcherctl queue retention`` and ``dispatcherctl jobs prune``: how long finished jobs are kept,
and deleting old ones by hand."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardq_common.durations import parse_duration_ms
from worker_sdk import Client

from .ctl_queues import info_json

STATUSES = ("succeeded", "cancelled", "dead")
#: Rows one PruneJobs call deletes: a call takes seconds, well inside the client's timeout.
ROWS_PER_CALL = 20_000


class RetentionUsageError(ValueError):
    pass


def _seconds(text: str, option: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise RetentionUsageError(f"{option}: {exc}") from None
    if ms < 60_000:
        raise RetentionUsageError(f"{option} {text!r}: give at least a minute (60s, 7d)")
    return ms // 1000


def _period_text(seconds: int) -> str:
    if not seconds:
        return "cluster default"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cmd_retention(client: Client, args: argparse.Namespace) -> Any:
    changes: dict[str, Any] = {}
    for option, name, value in (
        ("--succeeded", "retain_finished_s", args.succeeded),
        ("--dead", "retain_dead_s", args.dead),
    ):
        if value is not None:
            changes[name] = 0 if value == "default" else _seconds(value, option)
    if changes:
        info = client.set_queue_settings(args.type, **changes)
    else:
        info = client.get_queue(args.type)
    s = info.settings
    text = (
        f"{args.type}: succeeded and cancelled kept {_period_text(s.retain_finished_s)}, "
        f"dead kept {_period_text(s.retain_dead_s)}"
    )
    return info_json(info), text


def cmd_prune(client: Client, args: argparse.Namespace) -> Any:
    older_than_s = _seconds(args.older_than, "--older-than")
    statuses = [args.status] if args.status else []
    total = 0
    while True:
        rows, more = client.prune_jobs(
            older_than_s,
            job_type=args.type,
            statuses=statuses,
            dry_run=args.dry_run,
            limit=ROWS_PER_CALL,
        )
        total += rows
        if args.dry_run or not more:
            break
        print(f"deleted {total} so far...", file=sys.stderr)
    what = f"{args.status or 'finished'} job(s)" + (f" of {args.type}" if args.type else "")
    if args.dry_run:
        return {"would_delete": total}, f"{total} {what} older than {args.older_than} would be deleted"
    return {"deleted": total}, f"deleted {total} {what} older than {args.older_than}"


def add_queue_command(queue: Any) -> None:
    p = queue.add_parser(
        "retention",
        help="how long the type's finished jobs are kept (show, or set with --succeeded/--dead)",
        description="Durations: 90m, 12h, 7d ('default': the cluster's SHARDQ_RETENTION_*).",
    )
    p.add_argument("type")
    p.add_argument("--succeeded", help="keep succeeded and cancelled jobs this long (e.g. 7d)")
    p.add_argument("--dead", help="keep dead-lettered jobs this long (e.g. 30d)")
    p.set_defaults(func=cmd_retention)


def add_commands(sub: Any) -> Any:
    """``jobs prune``; returns the ``jobs`` subcommands for the others (ctl_search)."""
    jobs = sub.add_parser("jobs", help="search jobs and act on many at once").add_subparsers(
        dest="jobs_command", required=True
    )
    p = jobs.add_parser(
        "prune",
        help="delete finished jobs older than a duration (whatever their retention)",
        description="Deletes in batches; a job whose status write is not yet on disk is left.",
    )
    p.add_argument("--older-than", required=True, help="finished at least this long ago (e.g. 7d, 12h)")
    p.add_argument("--type", help="only this job type")
    p.add_argument("--status", choices=STATUSES, help="only this status (default: all three)")
    p.add_argument("--dry-run", action="store_true", help="print how many would go, delete nothing")
    p.set_defaults(func=cmd_prune)
    return jobs

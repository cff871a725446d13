"""``dispatcherctl jobs list`` (the search) and ``jobs cancel|requeue|run-now|delete`` (the bulk
actions), which take the same filter options."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from shardq_common.durations import parse_duration_ms
from worker_sdk import DEAD_REASONS, Client, JobFilter, JobInfo

from .tables import table

STATES = ("delayed", "ready", "leased", "succeeded", "dead", "cancelled", "waiting")
#: Jobs one BulkJobs call acts on: a call takes seconds, well inside the client's timeout.
JOBS_PER_CALL = 5_000
BULK = {
    # command: (the SDK's action, what it does, the past tense, which jobs)
    "cancel": ("cancel", "cancel", "cancelled", "delayed, ready, leased and waiting"),
    "requeue": ("requeue", "requeue", "requeued", "dead"),
    "run-now": ("run_now", "run now", "made due now", "delayed (first run or retry backoff)"),
    "delete": ("delete", "delete", "deleted", "succeeded, cancelled and dead"),
}


class SearchUsageError(ValueError):
    pass


def _when(text: str, option: str) -> float:
    """Epoch seconds from an ISO 8601 time or a duration ago (``1h``: an hour ago)."""
    try:
        return time.time() - parse_duration_ms(text) / 1000
    except ValueError:
        pass
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SearchUsageError(
            f"{option} {text!r}: give a duration ago (90m, 2d) or an ISO 8601 time (2026-12-24T18:00:00Z)"
        ) from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _payload(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        path, eq, text = item.partition("=")
        if not eq or not path.strip():
            raise SearchUsageError(f"--payload {item!r}: write FIELD=VALUE, e.g. customer_id=42")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text  # region=eu: a bare word is the string
        out[path.strip()] = value
    return out


def job_filter(args: argparse.Namespace) -> JobFilter:
    return JobFilter(
        types=tuple(args.type or ()),
        statuses=tuple(args.state or ()),
        priorities=tuple(args.priority or ()),
        created_after=_when(args.since, "--since") if args.since else None,
        created_before=_when(args.until, "--until") if args.until else None,
        finished_after=_when(args.finished_since, "--finished-since") if args.finished_since else None,
        finished_before=_when(args.finished_until, "--finished-until") if args.finished_until else None,
        idempotency_key=args.key or "",
        schedule=args.schedule or "",
        error_contains=args.error or "",
        payload=_payload(args.payload or []),
        dead_reason=args.reason or "",
    )


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds") if ms else "-"


def _json(job: JobInfo) -> dict[str, Any]:
    data = asdict(job)
    data["payload"] = job.payload.decode(errors="replace")
    data["result"] = job.result.decode(errors="replace")
    return data


def cmd_list(client: Client, args: argparse.Namespace) -> Any:
    page = client.list_jobs(
        job_filter(args),
        limit=args.limit,
        cursor=args.after or "",
        oldest_first=args.oldest_first,
        with_total=args.total,
    )
    rows = [
        (
            j.id,
            j.type,
            j.status,
            j.priority,
            j.attempts,
            _time(j.enqueued_at_ms),
            (j.last_error.strip().splitlines() or ["-"])[-1][:60],
        )
        for j in page.jobs
    ]
    text = (
        table(["id", "type", "status", "priority", "attempts", "created", "last_error"], rows)
        if rows
        else "no jobs match"
    )
    if page.total is not None:
        text += f"\n{'' if page.total_exact else '~'}{page.total} job(s) match"
    if page.next_cursor:
        text += f"\nnext page: --after {page.next_cursor}"
    data = {"jobs": [_json(j) for j in page.jobs], "next_cursor": page.next_cursor}
    if page.total is not None:
        data["total"], data["total_exact"] = page.total, page.total_exact
    return data, text


def cmd_bulk(client: Client, args: argparse.Namespace) -> Any:
    action, verb, done, which = BULK[args.jobs_command]
    selected = job_filter(args)
    if args.dry_run or not args.yes:
        found = client.bulk_jobs(action, selected, dry_run=True, limit=args.limit or 100_000)
        n = f"{found.matched}{'+' if found.more else ''}"
        text = f"{n} job(s) would be {done} ({which} jobs matching the filter)"
        if not args.dry_run:
            text += f"; run again with --yes to {verb} them"
        return {"would_touch": found.matched, "more": found.more}, text
    touched = matched = 0
    left = args.limit or None
    after_id = ""
    while True:
        result = client.bulk_jobs(
            action, selected, limit=min(JOBS_PER_CALL, left or JOBS_PER_CALL), after_id=after_id
        )
        touched += result.touched
        matched += result.matched
        after_id = result.last_id
        if left is not None:
            left -= result.matched
        if not result.more or (left is not None and left <= 0):
            break
        print(f"{done} {touched} so far...", file=sys.stderr)
    return {"matched": matched, "touched": touched}, f"{touched} job(s) {done} ({matched} matched)"


def add_filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--type", action="append", help="job type or pattern (billing.*); repeat for any of several"
    )
    p.add_argument("--state", action="append", choices=STATES, help="repeat for any of several")
    p.add_argument("--priority", action="append", choices=("high", "default", "low"))
    p.add_argument("--since", help="created at or after: a duration ago (2h) or an ISO 8601 time")
    p.add_argument("--until", help="created before: a duration ago or an ISO 8601 time")
    p.add_argument("--finished-since", help="finished at or after (as --since)")
    p.add_argument("--finished-until", help="finished before (as --until)")
    p.add_argument("--key", help="idempotency key")
    p.add_argument("--schedule", help="the schedule that made the job")
    p.add_argument("--error", help="text in the last error (case-sensitive)")
    p.add_argument(
        "--payload",
        action="append",
        metavar="FIELD=VALUE",
        help="payload field equal to a JSON value (customer_id=42, customer.region=eu); repeatable",
    )
    p.add_argument("--reason", choices=sorted(DEAD_REASONS), help="dead-letter reason")


def add_commands(jobs: Any) -> None:
    p = jobs.add_parser("list", help="search jobs by type, state, time, key, error text, payload field...")
    add_filter_options(p)
    p.add_argument("--limit", type=int, default=50, help="jobs per page (at most 500)")
    p.add_argument("--after", metavar="CURSOR", help="the next page: the cursor the previous one printed")
    p.add_argument(
        "--oldest-first",
        action="store_true",
        help="oldest first (default: newest first); with --finished-since/--finished-until, by finish time",
    )
    p.add_argument("--total", action="store_true", help="count the matches too (an estimate when large)")
    p.set_defaults(func=cmd_list)
    for name, (_, verb, _, which) in BULK.items():
        p = jobs.add_parser(
            name,
            help=f"{verb} the {which} jobs matching the filter",
            description="Without --yes (or with --dry-run) it only counts the jobs it would touch.",
        )
        add_filter_options(p)
        p.add_argument("--dry-run", action="store_true", help="count, change nothing")
        p.add_argument("--yes", action="store_true", help=f"{verb} them (without it: a dry run)")
        p.add_argument("--limit", type=int, default=0, help="at most this many jobs (default: all)")
        p.set_defaults(func=cmd_bulk)

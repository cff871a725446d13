"""``dispatcherctl queue ...``: flow control of job types (pause, concurrency and rate limits)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from worker_sdk import Client, QueueInfo, RateLimit

from ..queue.rates import parse_rate
from .tables import table

CLASSES = ("high", "default", "low")


class QueueUsageError(ValueError):
    pass


def _rate_text(rate: RateLimit | None) -> str:
    return "-" if rate is None else f"{rate.per_s:g}/s burst {rate.burst}"


def _named(values: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def _paused_text(info: QueueInfo) -> str:
    if info.paused:
        return "paused"
    return f"paused: {','.join(info.settings.paused)}" if info.settings.paused else "running"


def info_json(info: QueueInfo) -> dict[str, Any]:
    data = asdict(info)
    data["settings"]["paused"] = list(info.settings.paused)
    data["paused"] = info.paused
    return data


def _rows(info: QueueInfo) -> list[tuple[str, Any]]:
    s = info.settings
    return [
        ("type", info.job_type),
        ("state", _paused_text(info)),
        ("concurrency", s.concurrency or "-"),
        ("per-key concurrency", s.key_concurrency or "-"),
        ("key limits", _named(dict(s.key_concurrency_overrides))),
        ("key weights", _named(dict(s.key_weights))),
        ("rate", _rate_text(s.rate)),
        ("per-key rate", _rate_text(s.key_rate)),
        ("kept (succeeded, cancelled)", f"{s.retain_finished_s} s" if s.retain_finished_s else "default"),
        ("kept (dead)", f"{s.retain_dead_s} s" if s.retain_dead_s else "default"),
        ("delayed", info.delayed),
        ("ready", info.ready),
        ("running", info.running),
        ("keys running", info.keys_running),
        ("keys at their limit", info.keys_at_limit),
        ("shard", info.shard),
    ]


def flow_table(queues: list[QueueInfo]) -> str:
    """Per type: its state, limits and live figures (``queue list``, and ``stats`` for the types
    with settings)."""
    rows = [
        (
            q.job_type,
            _paused_text(q),
            q.ready,
            f"{q.running}/{q.settings.concurrency}" if q.settings.concurrency else q.running,
            q.settings.key_concurrency or "-",
            f"{q.keys_at_limit}/{q.keys_running}",
            _rate_text(q.settings.rate),
        )
        for q in queues
    ]
    headers = ["type", "state", "ready", "running", "per_key", "keys_at_limit", "rate"]
    return table(headers, rows)


def cmd_list(client: Client, args: argparse.Namespace) -> Any:
    queues = client.list_queues()
    return [info_json(q) for q in queues], flow_table(queues) if queues else "no queues"


def cmd_show(client: Client, args: argparse.Namespace) -> Any:
    info = client.get_queue(args.type)
    return info_json(info), table(["field", "value"], _rows(info))


def cmd_pause(client: Client, args: argparse.Namespace) -> Any:
    info = client.pause_queue(args.type, args.priority)
    what = f"{args.type} ({args.priority})" if args.priority else args.type
    return info_json(info), f"{what} paused: nothing more starts; running jobs finish"


def cmd_resume(client: Client, args: argparse.Namespace) -> Any:
    info = client.resume_queue(args.type, args.priority)
    what = f"{args.type} ({args.priority})" if args.priority else args.type
    return info_json(info), f"{what} resumed ({_paused_text(info)})"


def _pairs(values: list[str] | None, option: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values or []:
        key, eq, number = value.rpartition("=")
        if not eq or not key:
            raise QueueUsageError(f"{option} {value!r}: write KEY=N")
        try:
            out[key] = int(number)
        except ValueError:
            raise QueueUsageError(f"{option} {value!r}: N must be a whole number") from None
    return out


def _bucket(rate: str | None, burst: int | None, prefix: str) -> RateLimit | None | str:
    """The bucket the options --{prefix}rate and --{prefix}burst give: a RateLimit, None (no limit),
    or "" (not given)."""
    if rate is None:
        if burst is not None:
            raise QueueUsageError(f"--{prefix}burst goes with its rate: give --{prefix}rate too")
        return ""
    try:
        per_s = parse_rate(rate)
    except ValueError as exc:
        raise QueueUsageError(f"--{prefix}rate: {exc}") from None
    return None if per_s is None else RateLimit(per_s, 1 if burst is None else burst)


def cmd_limit(client: Client, args: argparse.Namespace) -> Any:
    changes: dict[str, Any] = {}
    key_limits = _pairs(args.key_limit, "--key-limit")
    key_weights = _pairs(args.key_weight, "--key-weight")
    rate = _bucket(args.rate, args.burst, "")
    key_rate = _bucket(args.key_rate, args.key_burst, "key-")
    current = client.get_queue(args.type).settings if key_limits or key_weights else None
    if args.clear:
        changes = {"concurrency": 0, "key_concurrency": 0, "key_concurrency_overrides": {}, "key_weights": {}}
        changes |= {"rate": None, "key_rate": None}
    if args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    if args.per_key_concurrency is not None:
        changes["key_concurrency"] = args.per_key_concurrency
    if key_limits:  # merged into the type's list; KEY=0 takes a key off it
        assert current is not None
        merged = {**({} if args.clear else current.key_concurrency_overrides), **key_limits}
        changes["key_concurrency_overrides"] = {k: v for k, v in merged.items() if v != 0}
    if key_weights:
        assert current is not None
        merged = {**({} if args.clear else current.key_weights), **key_weights}
        changes["key_weights"] = {k: v for k, v in merged.items() if v != 0}
    if rate != "":
        changes["rate"] = rate
    if key_rate != "":
        changes["key_rate"] = key_rate
    if not changes:
        raise QueueUsageError(
            "nothing to change: give a limit (see dispatcherctl queue limit --help) or --clear"
        )
    info = client.set_queue_settings(args.type, **changes)
    return info_json(info), f"{args.type} limits saved\n" + table(["field", "value"], _rows(info))


def add_commands(sub: Any) -> Any:
    """The ``queue`` commands; returns their subparsers (ctl_retention adds ``queue retention``)."""
    queue = sub.add_parser("queue", help="flow control: pause, concurrency and rate limits").add_subparsers(
        dest="queue_command", required=True
    )
    p = queue.add_parser("list", help="every type with settings or jobs: state, limits, live figures")
    p.set_defaults(func=cmd_list)
    p = queue.add_parser("show", help="one type's settings and live figures")
    p.add_argument("type")
    p.set_defaults(func=cmd_show)
    for name, func, help_text in (
        ("pause", cmd_pause, "start no more jobs of the type (running ones finish)"),
        ("resume", cmd_resume, "start jobs of the type again"),
    ):
        p = queue.add_parser(name, help=help_text)
        p.add_argument("type")
        p.add_argument("--priority", choices=CLASSES, help="only this priority class (default: every class)")
        p.set_defaults(func=func)
    p = queue.add_parser(
        "limit",
        help="set concurrency and rate limits (the limits not given keep their values)",
        description="Rates are N/s, N/m or N/h (none: no limit). Limits of 0 mean no limit.",
    )
    p.add_argument("type")
    p.add_argument("--concurrency", type=int, help="most jobs of the type running at once (0: no limit)")
    p.add_argument("--per-key-concurrency", type=int, help="most jobs of one concurrency key running at once")
    p.add_argument("--key-limit", action="append", metavar="KEY=N", help="a key's own limit (KEY=0: remove)")
    p.add_argument(
        "--key-weight", action="append", metavar="KEY=W", help="a key's share of leases (default 1)"
    )
    p.add_argument("--rate", help="the type's rate, e.g. 100/s (none: no rate limit)")
    p.add_argument(
        "--burst", type=int, help="jobs the type may start at once after a quiet spell (default 1)"
    )
    p.add_argument("--key-rate", help="each key's rate, e.g. 5/s")
    p.add_argument("--key-burst", type=int, help="each key's burst (default 1)")
    p.add_argument("--clear", action="store_true", help="every limit back to none first (a pause stays)")
    p.set_defaults(func=cmd_limit)
    return queue

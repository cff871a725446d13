"""``dispatcherctl``: enqueue, inspect and operate a shardq cluster from the shell."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, NoReturn

import grpc

from worker_sdk import DEAD_REASONS, AttemptInfo, Client, JobInfo, ShardqError

from . import ctl_queues, ctl_retention, ctl_schedules, ctl_search, job_graph
from .extra import missing_extra_message
from .tables import table


class UsageError(Exception):
    pass


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds") if ms else "-"


def _payload_arg(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload is not valid JSON: {exc.msg} at position {exc.pos}") from None


def _at_arg(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--at {text!r} is not an ISO 8601 time (e.g. 2026-12-24T18:00:00+01:00)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def cmd_enqueue(client: Client, args: argparse.Namespace) -> Any:
    if args.delay is not None and args.at is not None:
        raise UsageError("give --delay or --at, not both")
    options: dict[str, Any] = {"priority": args.priority}
    if args.delay is not None:
        if not args.delay >= 0:  # NaN too
            raise UsageError("--delay must be a number of seconds, not negative")
        options["delay"] = args.delay
    if args.at is not None:
        options["run_at"] = _at_arg(args.at)
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    if args.key:
        options["idempotency_key"] = args.key
    if args.lease_ttl is not None:
        options["lease_ttl"] = args.lease_ttl
    job_id = client.enqueue(args.type, _payload_arg(args.payload), **options)
    return {"job_id": job_id}, job_id


def _job_rows(job: JobInfo) -> list[tuple[str, Any]]:
    return [
        ("id", job.id),
        ("type", job.type),
        ("status", job.status),
        ("priority", job.priority),
        (
            "attempts",
            f"{job.attempts} (failures {job.failures}, expirations {job.expirations}) of {job.max_attempts}",
        ),
        ("run_at", _time(job.run_at_ms)),
        ("enqueued_at", _time(job.enqueued_at_ms)),
        ("started_at", _time(job.started_at_ms)),
        ("finished_at", _time(job.finished_at_ms)),
        ("lease_until", _time(job.lease_until_ms)),
        ("dead_reason", job.dead_reason or "-"),
        ("idempotency_key", job.idempotency_key or "-"),
        ("shard", job.shard),
        ("payload", job.payload.decode(errors="replace") or "-"),
        ("last_error", (job.last_error or "-").strip().splitlines()[-1] if job.last_error else "-"),
        ("progress", "-" if job.progress is None else json.dumps(job.progress)),
        ("result", job.result.decode(errors="replace") or "-"),
    ]


def _duration(a: AttemptInfo) -> str:
    if not (a.finished_at_ms and a.started_at_ms):
        return "-"
    return f"{(a.finished_at_ms - a.started_at_ms) / 1000:.3f}s"


def _timeline(job: JobInfo) -> str:
    """The job's runs, oldest first, then the traceback of each failed one."""
    if not job.attempt_history:
        return "attempts: none recorded"
    rows = [
        (a.attempt, a.worker_id or "-", _time(a.started_at_ms), _time(a.finished_at_ms), _duration(a),
         a.outcome, a.error or "-")
        for a in job.attempt_history
    ]  # fmt: skip
    text = "attempts:\n" + table(["#", "worker", "started", "finished", "took", "outcome", "error"], rows)
    for a in job.attempt_history:
        if a.traceback:
            text += f"\n\nattempt {a.attempt} traceback:\n" + a.traceback.rstrip()
    return text


def _job_json(job: JobInfo) -> dict[str, Any]:
    data = asdict(job)
    data["payload"] = job.payload.decode(errors="replace")
    data["result"] = job.result.decode(errors="replace")
    return data


def cmd_job_show(client: Client, args: argparse.Namespace) -> Any:
    job = client.get_job(args.id)
    if args.graph:
        return _job_json(job), job_graph.draw(client, job)
    return _job_json(job), table(["field", "value"], _job_rows(job)) + "\n\n" + _timeline(job)


def _event_line(job: JobInfo) -> str:
    progress = "-" if job.progress is None else json.dumps(job.progress)
    return (
        f"{datetime.now(tz=UTC).isoformat(timespec='milliseconds')}  {job.status:<9}  "
        f"attempt {job.attempts}/{job.max_attempts}  progress {progress}"
    )


def cmd_job_watch(client: Client, args: argparse.Namespace) -> Any:
    """Print the job's changes live (one line each, or a JSON object per line with --json) until it
    finishes, then its outcome."""
    if args.wait is not None and not args.wait > 0:
        raise UsageError("--wait must be a number of seconds above 0")
    job = None
    try:
        for job in client.watch(args.id, timeout=args.wait):
            line = json.dumps(_job_json(job)) if args.json else _event_line(job)
            print(line, flush=True)
    except TimeoutError as exc:
        raise ShardqError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
    assert job is not None
    if job.status == "succeeded":
        text = f"{job.id} succeeded; result: {job.result.decode(errors='replace') or '-'}"
    elif job.status == "dead":
        last = job.last_error.strip().splitlines()[-1] if job.last_error else "-"
        text = f"{job.id} is dead ({job.dead_reason}): {last}"
    else:
        text = f"{job.id} was cancelled"
    return {"job_id": job.id, "status": job.status}, text


def cmd_job_cancel(client: Client, args: argparse.Namespace) -> Any:
    status = client.cancel(args.id)
    text = {
        "cancelled": f"{args.id} cancelled: it will not run",
        "leased": f"{args.id} is running: asked the worker to stop; it will not be retried",
    }.get(status, f"{args.id} had already finished ({status})")
    return {"job_id": args.id, "status": status}, text


def cmd_stats(client: Client, args: argparse.Namespace) -> Any:
    stats = client.stats()
    rows = [
        (q.type, q.priority, q.delayed, q.ready, q.leased, q.dead, f"{q.oldest_ready_age_ms / 1000:.1f}s")
        for q in stats
    ]
    text = (
        table(["type", "priority", "delayed", "ready", "leased", "dead", "oldest_ready"], rows)
        if rows
        else "no jobs pending"
    )
    try:
        schedules = client.schedules()
    except ShardqError as exc:  # reading schedules is the admin's: a producer sees the queues only
        if exc.code is not grpc.StatusCode.PERMISSION_DENIED:
            raise
        schedules = []
    if schedules:
        text += "\n\n" + table(
            ["schedule", "type", "materialized", "skipped", "next"],
            [(s.name, s.job_type, s.materialized, s.skipped, _time(s.next_occurrence_ms)) for s in schedules],
        )
    try:  # flow control is the admin's too
        limited = [q for q in client.list_queues() if q.updated_at_ms]
    except ShardqError as exc:
        if exc.code is not grpc.StatusCode.PERMISSION_DENIED:
            raise
        limited = []
    if limited:
        text += "\n\n" + ctl_queues.flow_table(limited)
    data = {
        "queues": [asdict(q) for q in stats],
        "flow_control": [ctl_queues.info_json(q) for q in limited],
        "schedules": [
            {"name": s.name, "type": s.job_type, "materialized": s.materialized, "skipped": s.skipped}
            for s in schedules
        ],
    }
    return data, text


def cmd_dlq_list(client: Client, args: argparse.Namespace) -> Any:
    jobs = client.dead_letters(job_type=args.type, reason=args.reason, limit=args.limit)
    rows = [
        (
            j.id,
            j.type,
            j.dead_reason,
            j.attempts,
            _time(j.finished_at_ms),
            (j.last_error.strip().splitlines() or ["-"])[-1][:80],
        )
        for j in jobs
    ]
    text = (
        table(["id", "type", "reason", "attempts", "dead_at", "last_error"], rows)
        if rows
        else "the dead-letter queue is empty"
    )
    return [_job_json(j) for j in jobs], text


def cmd_dlq_requeue(client: Client, args: argparse.Namespace) -> Any:
    if bool(args.ids) == args.all:
        raise UsageError("give job ids or --all")
    n = client.requeue_dead(args.ids, all=args.all, job_type=args.type, reason=args.reason)
    return {"requeued": n}, f"requeued {n} job(s)"


def cmd_dlq_purge(client: Client, args: argparse.Namespace) -> Any:
    n = client.purge_dead(job_type=args.type, reason=args.reason)
    return {"purged": n}, f"purged {n} job(s)"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (``dispatcherctl: …``) and exit 2, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"dispatcherctl: {message} (see {self.prog} --help)\n")


def cmd_shards(client: Client, args: argparse.Namespace) -> Any:
    view = client.shard_map()
    rows = [(s.shard, s.owner or "-", s.epoch, s.address or "-", s.pending) for s in view.shards]
    members = ", ".join(f"{m.id} ({m.address}{'' if m.alive else ', down'})" for m in view.members) or "none"
    text = f"members: {members}\n" + table(["shard", "owner", "epoch", "address", "pending"], rows)
    data = {
        "shard_count": view.shard_count,
        "members": [{"id": m.id, "address": m.address, "alive": m.alive} for m in view.members],
        "shards": [
            {"shard": s.shard, "owner": s.owner, "epoch": s.epoch, "address": s.address, "pending": s.pending}
            for s in view.shards
        ],
    }
    return data, text


def cmd_rebalance(client: Client, args: argparse.Namespace) -> Any:
    if not args.wait >= 0:
        raise UsageError("--wait must be a number of seconds, 0 or more")
    result = client.rebalance(dry_run=args.dry_run)
    rows = [(m.shard, m.source or "-", m.target, m.pending) for m in result.moves]
    moved = {m.shard: m.target for m in result.moves}
    if result.applied and moved and args.wait > 0:
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            owners = {s.shard: s.owner for s in client.shard_map().shards}
            if all(owners.get(shard) == target for shard, target in moved.items()):
                break
            time.sleep(0.2)
        else:
            raise ShardqError(grpc.StatusCode.DEADLINE_EXCEEDED, f"moves not finished after {args.wait:g} s")
    head = "plan (dry run, nothing moved)" if args.dry_run else "applied"
    text = (
        f"{head}: {len(rows)} shard(s) move\n" + table(["shard", "from", "to", "pending"], rows)
        if rows
        else "already balanced: nothing to move"
    )
    data = {
        "applied": result.applied,
        "moves": [{"shard": s, "from": f, "to": t, "pending": p} for s, f, t, p in rows],
    }
    return data, text


def cmd_health(client: Client, args: argparse.Namespace) -> Any:
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ModuleNotFoundError:
        raise UsageError(missing_extra_message("health", ["grpcio-health-checking"])) from None

    with client.security.channel(client.target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            raise ShardqError(exc.code(), exc.details() or "health check failed") from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if status != "SERVING":
        raise ShardqError(grpc.StatusCode.UNAVAILABLE, f"{client.target} is {status}")
    return {"target": client.target, "status": status}, f"{client.target} is {status}"


def _add_global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The connection and output options. The top-level parser gets them with their defaults; every
    subcommand gets them again without defaults, so ``dispatcherctl stats --json`` works as
    ``dispatcherctl --json stats`` does (kubectl, gh and docker accept them on either side)."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--target",
        default=default(None),
        help="dispatcher address (env SHARDQ_TARGET, default 127.0.0.1:7070)",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON instead of tables"
    )
    parser.add_argument(
        "--timeout", type=float, default=default(30.0), help="seconds to wait for the dispatcher"
    )
    parser.add_argument(
        "--token",
        default=default(None),
        help="bearer token (env SHARDQ_TOKEN); prefer the env: argv is visible",
    )
    parser.add_argument(
        "--tls", action="store_true", default=default(None), help="use TLS (env SHARDQ_TLS=1)"
    )
    parser.add_argument(
        "--tls-ca",
        default=default(None),
        help="PEM CA to check the dispatcher's certificate (env SHARDQ_TLS_CA)",
    )
    parser.add_argument(
        "--tls-cert",
        default=default(None),
        help="client certificate for mutual TLS (env SHARDQ_TLS_CLIENT_CERT)",
    )
    parser.add_argument(
        "--tls-key", default=default(None), help="its private key (env SHARDQ_TLS_CLIENT_KEY)"
    )
    parser.add_argument(
        "--tls-server-name",
        default=default(None),
        help="name to check in the dispatcher's certificate (env SHARDQ_TLS_SERVER_NAME)",
    )


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of the runnable commands (``stats``, ``job show``, ``schedule add``, ...)."""
    children = [
        child
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for child in action.choices.values()
    ]
    if not children:
        return [parser]
    return [leaf for child in children for leaf in _leaf_parsers(child)]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dispatcherctl", description="operate a shardq dispatcher")
    _add_global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("enqueue", help="enqueue a job and print its id")
    p.add_argument("type")
    p.add_argument("--payload", help="JSON payload")
    p.add_argument("--delay", type=float, help="seconds from now")
    p.add_argument("--at", help="ISO 8601 time to run at")
    p.add_argument("--priority", choices=["high", "default", "low"], default="default")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--lease-ttl", type=float, help="lease TTL in seconds")
    p.add_argument("--key", help="idempotency key")
    p.set_defaults(func=cmd_enqueue)

    job = sub.add_parser("job", help="inspect or cancel one job").add_subparsers(
        dest="job_command", required=True
    )
    p = job.add_parser("show")
    p.add_argument("id")
    p.add_argument(
        "--graph", action="store_true", help="draw its workflow: what it waits for, what waits for it"
    )
    p.set_defaults(func=cmd_job_show)
    p = job.add_parser("watch", help="follow a job live (status, progress) until it finishes")
    p.add_argument("id")
    p.add_argument("--wait", type=float, help="give up after this many seconds (default: no limit)")
    p.set_defaults(func=cmd_job_watch)
    p = job.add_parser("cancel")
    p.add_argument("id")
    p.set_defaults(func=cmd_job_cancel)

    p = sub.add_parser("stats", help="queue depth per type and priority")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("health", help="exit 0 when the dispatcher is SERVING (a probe for scripts)")
    p.add_argument("--service", default="", help="grpc.health.v1 service name (default: the server)")
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("shards", help="the shard map: owner, epoch and pending jobs per shard")
    p.set_defaults(func=cmd_shards)
    p = sub.add_parser("rebalance", help="balance shards over the live dispatchers, live")
    p.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the moves (0: do not wait)")
    p.set_defaults(func=cmd_rebalance)

    dlq = sub.add_parser("dlq", help="the dead-letter queue").add_subparsers(
        dest="dlq_command", required=True
    )
    for name, func, help_text in (
        ("list", cmd_dlq_list, "list dead jobs"),
        ("requeue", cmd_dlq_requeue, "run dead jobs again"),
        ("purge", cmd_dlq_purge, "delete dead jobs"),
    ):
        p = dlq.add_parser(name, help=help_text)
        p.add_argument("--type", help="only this job type")
        p.add_argument("--reason", choices=sorted(DEAD_REASONS), help="only this reason")
        if name == "list":
            p.add_argument("--limit", type=int, default=100)
        if name == "requeue":
            p.add_argument("ids", nargs="*")
            p.add_argument("--all", action="store_true", help="every dead job matching the filters")
        p.set_defaults(func=func)
    ctl_schedules.add_commands(sub)
    ctl_retention.add_queue_command(ctl_queues.add_commands(sub))
    ctl_search.add_commands(ctl_retention.add_commands(sub))
    for leaf in _leaf_parsers(parser):
        _add_global_options(leaf, defaults=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        security = {
            "token": args.token,
            "tls": args.tls,
            "tls_ca": args.tls_ca,
            "tls_cert": args.tls_cert,
            "tls_key": args.tls_key,
            "tls_server_name": args.tls_server_name,
        }
        # Never routed (the default, kept explicit): one call per run, often through a port-forward
        # that reaches only the target, and any dispatcher takes an enqueue.
        with Client(args.target, timeout=args.timeout, route=False, **security) as client:
            data, text = args.func(client, args)
    except UsageError as exc:
        print(f"dispatcherctl: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"dispatcherctl: {exc}", file=sys.stderr)
        return 2
    except ShardqError as exc:
        print(f"dispatcherctl: {exc.code.name.lower().replace('_', ' ')}: {exc.details}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``dispatcher run``, ``dispatcher demo`` and ``dispatcher demo-worker``."""

from __future__ import annotations

import argparse
import os
import sys

from shardq_common.errors import DispatcherError
from shardq_common.logs import configure

from .extra import missing_dispatcher_extra, missing_extra_message


def _run(args: argparse.Namespace) -> int:
    from ..config import Settings
    from ..queue import flow_file
    from ..schedules import file as schedules_file

    if args.processes is None and "SHARDQ_PROCESSES" not in os.environ:
        args.processes = os.cpu_count() or 1
    settings = Settings.from_env(
        processes=args.processes,
        redis_url=args.redis_url,
        db_url=args.db_url,
        listen=args.listen,
        shard_count=args.shards,
        log_level=args.log_level,
    )
    configure(settings.log_level, settings.log_format)
    schedules_file.check(settings)
    flow_file.check(settings.queues_file)
    from ..api.security import ServerSecurity

    ServerSecurity.from_settings(settings)  # bad certificates or tokens: a clear error now, not per child
    import uvloop

    # The dashboard beside the dispatcher: in the supervisor, or in a lone process; never in a
    # supervised child (they share the supervisor's environment, and one port).
    dashboard = bool(os.environ.get("SHARDQ_DASHBOARD_LISTEN")) and not settings.shared_listen
    if dashboard and _missing_dashboard_extra():
        return 2
    if settings.processes > 1:
        from ..cluster.supervisor import Supervisor

        if dashboard:
            from .dashboard import with_dashboard

            return int(uvloop.run(with_dashboard(Supervisor(settings).run(), settings.listen)))
        return int(uvloop.run(Supervisor(settings).run()))
    from ..server import run_until_signalled

    if dashboard:
        from .dashboard import with_dashboard

        uvloop.run(with_dashboard(run_until_signalled(settings), settings.listen))
        return 0
    uvloop.run(run_until_signalled(settings))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.dashboard and _missing_dashboard_extra():
        return 2
    return run_demo(jobs=args.jobs, dashboard_listen=args.dashboard_listen if args.dashboard else None)


def _missing_dashboard_extra() -> bool:
    try:
        import cryptography  # noqa: F401
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"dispatcher: the dashboard needs the dashboard extra ({exc.name} is not installed): "
              "pip install 'shardq[dashboard]'", file=sys.stderr)  # fmt: skip
        return True
    return False


def _dashboard(args: argparse.Namespace) -> int:
    if _missing_dashboard_extra():
        return 2
    from .dashboard import run_dashboard

    return run_dashboard(
        listen=args.listen, target=args.target, allow_open=args.allow_open, allowed_hosts=args.allowed_hosts
    )


def _demo_worker(args: argparse.Namespace) -> int:
    from .demo_worker import run_demo_worker

    return run_demo_worker(args.target, args.concurrency)


def main(argv: list[str] | None = None) -> int:
    missing = missing_dispatcher_extra()
    if missing:
        # Before the dispatcher's modules are imported: without the extra they would fail in a traceback.
        print(f"dispatcher: {missing_extra_message('the dispatcher', missing)}", file=sys.stderr)
        return 2  # START_FAILED, whose module is one of those that cannot be imported
    from ..cluster.supervisor import START_FAILED

    parser = argparse.ArgumentParser(prog="dispatcher", description="shardq dispatcher daemon")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a dispatcher (embedded Redis and SQLite unless URLs are given)")
    run.add_argument(
        "--processes",
        type=int,
        help="dispatcher processes under one supervisor (env SHARDQ_PROCESSES; default: the number of CPUs)",
    )
    run.add_argument("--redis-url", help="Redis URL (env SHARDQ_REDIS_URL); unset: a private redis-server")
    run.add_argument("--db-url", help="postgresql://... or sqlite:///path (env SHARDQ_DB_URL); unset: SQLite")
    run.add_argument("--listen", help="gRPC address (env SHARDQ_LISTEN, default 127.0.0.1:7070)")
    run.add_argument(
        "--shards", type=int, help="shard count when the cluster is created (SHARDQ_SHARD_COUNT)"
    )
    run.add_argument("--log-level", help="debug, info, warning, error (SHARDQ_LOG_LEVEL)")
    run.set_defaults(func=_run)
    demo = sub.add_parser(
        "demo", help="run a dispatcher and a worker on embedded defaults and show jobs flow"
    )
    demo.add_argument("--jobs", type=int, default=40, help="how many jobs the demo enqueues")
    demo.add_argument(
        "--dashboard",
        action="store_true",
        help="after the summary, keep the dispatcher and a web dashboard running (Ctrl-C ends them)",
    )
    demo.add_argument(
        "--dashboard-listen", default="127.0.0.1:7080", help="where the demo's dashboard listens"
    )
    demo.set_defaults(func=_demo)
    dashboard = sub.add_parser(
        "dashboard", help="serve the web dashboard, a client of the dispatchers' gRPC API"
    )
    dashboard.add_argument(
        "--listen", help="HOST:PORT to serve (env SHARDQ_DASHBOARD_LISTEN, default 127.0.0.1:7080)"
    )
    dashboard.add_argument("--target", help="a dispatcher's gRPC address (env SHARDQ_TARGET)")
    dashboard.add_argument(
        "--allow-open",
        action="store_true",
        default=None,
        help="serve a non-loopback address although the dispatcher checks no tokens "
        "(env SHARDQ_DASHBOARD_ALLOW_OPEN=1)",
    )
    dashboard.add_argument(
        "--allowed-hosts",
        help="comma-separated Host names the dashboard answers, e.g. shardq.example.com "
        "(env SHARDQ_DASHBOARD_ALLOWED_HOSTS; default: the loopback names, or the listen address)",
    )
    dashboard.set_defaults(func=_dashboard)
    demo_worker = sub.add_parser(
        "demo-worker", help="run a worker with demonstration handlers (demo.echo, demo.sleep, ...)"
    )
    demo_worker.add_argument("--target", help="the dispatcher's address (env SHARDQ_TARGET)")
    demo_worker.add_argument("--concurrency", type=int, default=16, help="jobs run at once")
    demo_worker.set_defaults(func=_demo_worker)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return START_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

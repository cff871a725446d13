"""The benchmark's command line.

    python -m bench run [--quick] [--peers arq,rq,celery,dramatiq,saq,bullmq|none]
                        [--scenarios ingest,drain,latency,delay,scale,memory,drain-redis,...] [--out DIR]
    python -m bench sweep --system NAME [--scenario drain|instant] [--work noop|redis|io1ms|cpu100us]
                          --concurrency 10,50,200 [--repeat N] [--quick]
    python -m bench report DIR [--merge OTHER_DIR]
    python -m bench soak [--minutes 30] [--rate 116] [--burst-rate 10000] [--burst-every 150] ...

Sets up everything itself (private redis-servers, PostgreSQL, dispatchers, each peer's venv or npm
folder under .bench-cache/) and writes results.json, results.md and PNG plots to
bench/results/<date>/ unless --out says otherwise. ``--peers none --scenarios drain`` measures one
scenario for shardq alone, which is what an optimisation loop wants; ``report DIR --merge OTHER``
folds such a run's figures into a full run's results and rewrites its table and plots.

The plain scenarios run no-op jobs (the queue's own cost per job); ``drain-WORK`` and
``instant-WORK`` run jobs whose handlers make one Redis round trip (``redis``), wait 1 ms on I/O
(``io1ms``) or spend 100 µs of CPU (``cpu100us``), each system at the concurrency its adapter pins
for that work. ``sweep`` measures one system at several concurrencies, to find that one.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from shardq_common.logs import configure as configure_logs

from .run import Plan, merge, rewrite, run
from .sizes import FULL, QUICK
from .sweep import SweepPlan, sweep
from .systems import ALL_SCENARIOS, PEERS, QUICK_SCENARIOS, WORK_KINDS

RESULTS = Path(__file__).resolve().parent / "results"


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    if text == "none":
        return []
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [c for c in chosen if c not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return [a for a in allowed if a in chosen]


def _command(argv: list[str]) -> str:
    """The command as results show it: an output folder outside the repository is not named (a
    machine's own path means nothing in a committed result)."""
    shown = list(argv)
    for i, arg in enumerate(shown[:-1]):
        if arg == "--out":
            out = Path(shown[i + 1]).resolve()
            root = RESULTS.parent.parent
            shown[i + 1] = str(out.relative_to(root)) if out.is_relative_to(root) else "DIR"
    return shlex.join(["python", "-m", "bench", *shown])


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--concurrency {text!r}: comma-separated whole numbers, e.g. 10,50,200") from None
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"--concurrency {text!r}: at least one value, each 1 or more")
    return values


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=formatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("run", help="run the benchmark", description=__doc__, formatter_class=formatter)
    cmd.add_argument(
        "--quick", action="store_true", help="small sizes: a shardq-only run in well under a minute"
    )
    cmd.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers, or none")
    cmd.add_argument(
        "--scenarios",
        help=f"comma-separated scenarios (default: all; with --quick: {','.join(QUICK_SCENARIOS)})",
    )
    cmd.add_argument("--out", type=Path, help="output folder (default bench/results/<YYYY-MM-DD>)")
    cmd.add_argument(
        "--dispatcher-processes", type=int, default=2,
        help="shardq dispatcher processes (default 2: `dispatcher run`'s default, the CPU count, on 2 cores)",
    )  # fmt: skip
    swept = commands.add_parser(
        "sweep", help="one scenario for one system at several worker concurrencies (jobs/s per value)"
    )
    swept.add_argument("--system", required=True, choices=("shardq", *PEERS))
    swept.add_argument("--scenario", default="drain", choices=("drain", "instant"))
    swept.add_argument("--work", default="redis", choices=("noop", *WORK_KINDS), help="the handlers' work")
    swept.add_argument("--concurrency", required=True, help="comma-separated values, e.g. 10,50,200,1000")
    swept.add_argument("--repeat", type=int, default=1, help="measure each value this many times (in turns)")
    swept.add_argument("--quick", action="store_true", help="the quick sizes (a smoke test of the sweep)")
    swept.add_argument("--out", type=Path, help="folder for the logs (default a temporary one)")
    swept.add_argument("--dispatcher-processes", type=int, default=2, help="shardq dispatcher processes")
    report = commands.add_parser(
        "report",
        help="rewrite results.md and the plots of a run, optionally folding in another run's figures",
    )
    report.add_argument("out", type=Path, help="the run's folder (with results.json)")
    report.add_argument("--merge", type=Path, help="another run's folder whose figures replace the same ones")
    _soak_parser(commands)
    judge = commands.add_parser(
        "soak-judge",
        help="judge a soak's samples.csv again, with the current verdict (prints it, changes nothing)",
    )
    judge.add_argument("samples", type=Path, help="a soak's samples.csv, or the folder that holds it")
    judge.add_argument("--tolerance", type=float, default=0.10, help="flatness: last third vs second (0.10)")
    judge.add_argument("--latency-tolerance", type=float, default=0.50, help="latency drift allowed (0.50)")
    args = parser.parse_args(argv)
    if args.command == "soak-judge":
        _soak_judge(args)
        return
    if args.command == "soak":
        _soak(args, _command(argv if argv is not None else sys.argv[1:]))
        return
    if args.command == "report":
        _report(args.out, args.merge)
        return
    if args.command == "sweep":
        _sweep(args)
        return
    default_scenarios = QUICK_SCENARIOS if args.quick else ALL_SCENARIOS
    plan = Plan(
        scenarios=_choices(args.scenarios or ",".join(default_scenarios), ALL_SCENARIOS, "scenarios"),
        peers=_choices(args.peers, PEERS, "peers"),
        sizes=QUICK if args.quick else FULL,
        quick=args.quick,
        out=args.out or RESULTS / datetime.now(UTC).date().isoformat(),
        dispatcher_processes=args.dispatcher_processes,
        command=_command(argv if argv is not None else sys.argv[1:]),
    )
    configure_logs("warning", "console")  # the embedded Redis' start-up line is noise here
    results = run(plan)
    print(f"results: {plan.out / 'results.json'}, {plan.out / 'results.md'}")
    for note in results.get("plots", {}).get("notes", []):
        print(note)


def _sweep(args: argparse.Namespace) -> None:
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: 1 or more")
    plan = SweepPlan(
        system=args.system,
        scenario=args.scenario,
        work=args.work,
        concurrencies=_concurrencies(args.concurrency),
        repeat=args.repeat,
        sizes=QUICK if args.quick else FULL,
        log_dir=args.out or Path(tempfile.mkdtemp(prefix="bench-sweep-")),
        dispatcher_processes=args.dispatcher_processes,
    )
    configure_logs("warning", "console")
    sweep(plan)
    print(f"logs: {plan.log_dir}")


def _report(out: Path, other: Path | None) -> None:
    if other is not None:
        merge(out, other)
    else:
        rewrite(out)
    print(f"rewrote {out / 'results.md'}")


def _soak_parser(commands: argparse._SubParsersAction) -> None:
    from .soak import __doc__ as soak_doc

    soak = commands.add_parser(
        "soak", help="the compressed-month soak: every resource flat under the mission's daily shape",
        description=soak_doc, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    soak.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    soak.add_argument("--rate", type=float, default=116.0, help="steady jobs/s (default 116: 10M a day)")
    soak.add_argument("--burst-rate", type=float, default=10_000.0, help="jobs/s during a burst (10,000)")
    soak.add_argument(
        "--burst-seconds", type=float, default=42.0,
        help="a burst's length (default 42 s: 30 minutes offer 5.2M jobs)",
    )  # fmt: skip
    soak.add_argument(
        "--burst-every", type=float, default=150.0,
        help="seconds from one burst to the next, a compressed hour (default 150: 4 per third of 30 minutes)",
    )  # fmt: skip
    soak.add_argument("--max-delay", type=float, default=30.0, help="delayed jobs wait up to this (30 s)")
    soak.add_argument("--retention", default="2m", help="retention of finished jobs (a duration, or off)")
    soak.add_argument("--sample", type=float, default=10.0, help="seconds between samples (default 10)")
    soak.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    soak.add_argument("--dispatcher-processes", type=int, default=2)
    soak.add_argument("--tolerance", type=float, default=0.10, help="flatness: last third vs second (0.10)")
    soak.add_argument("--latency-tolerance", type=float, default=0.50, help="latency drift allowed (0.50)")
    soak.add_argument(
        "--shared-postgres", action="store_true",
        help="use SHARDQ_TEST_PG_URL or the server at 127.0.0.1:5432 (default: a private throwaway cluster)",
    )  # fmt: skip
    soak.add_argument("--out", type=Path, help="output folder (default bench/results/<date>/soak)")


def _soak_judge(args: argparse.Namespace) -> None:
    import json

    from .soak.samples import read_csv
    from .soak.verdict import bursts_table, judge, thirds_table, verdict_line

    path = args.samples / "samples.csv" if args.samples.is_dir() else args.samples
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (a soak's samples.csv, or its folder)")
    try:
        samples = read_csv(path)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if len(samples) < 6:
        raise SystemExit(f"{path}: {len(samples)} samples, the verdict needs 6 or more")
    # Whether every job ran is not in the samples: the run's soak.json, when it is beside them, says.
    beside = path.parent / "soak.json"
    run = json.loads(beside.read_text()) if beside.is_file() else {}
    figures = run.get("figures", {})
    checks = judge(samples, args.tolerance, args.latency_tolerance)
    for line in [*thirds_table(checks), "", *bursts_table(samples), ""]:
        print(line)
    if "all_ran" not in run:
        print(f"no soak.json beside {path}: whether every job ran is not judged")
    line = verdict_line(checks, run.get("all_ran", True), figures.get("jobs_enqueued", 0),
                        figures.get("jobs_left_in_redis"), True)  # fmt: skip
    print(line)
    if line.startswith("SOAK FAILED"):
        raise SystemExit(1)


def _soak(args: argparse.Namespace, command: str) -> None:
    from shardq_common.durations import parse_duration_ms

    from .soak.load import LoadShape
    from .soak.run import SoakPlan
    from .soak.run import run as run_soak

    if args.retention != "off":
        try:
            parse_duration_ms(args.retention)
        except ValueError as exc:
            raise SystemExit(f"--retention {args.retention!r}: {exc}") from None
    if args.minutes <= 0 or args.sample <= 0 or args.minutes * 60 < 6 * args.sample:
        raise SystemExit("--minutes must leave room for at least 6 samples of --sample seconds")
    if args.rate <= 0 or args.burst_rate < 0 or args.burst_seconds < 0 or args.burst_every < 0:
        raise SystemExit("--rate must be positive; --burst-rate, --burst-seconds, --burst-every 0 or more")
    if args.burst_every and args.burst_seconds >= args.burst_every:
        raise SystemExit("--burst-seconds must be shorter than --burst-every")
    if args.workers < 1 or args.dispatcher_processes < 1:
        raise SystemExit("--workers and --dispatcher-processes: 1 or more")
    if args.max_delay < 1:
        raise SystemExit("--max-delay: 1 s or more")
    shape = LoadShape(
        args.rate, args.burst_rate, args.burst_seconds, args.burst_every, max_delay=args.max_delay
    )
    plan = SoakPlan(
        minutes=args.minutes, shape=shape, retention=args.retention, sample_s=args.sample,
        out=args.out or RESULTS / datetime.now(UTC).date().isoformat() / "soak", workers=args.workers,
        dispatcher_processes=args.dispatcher_processes, tolerance=args.tolerance,
        latency_tolerance=args.latency_tolerance, command=command,
        private_postgres=not args.shared_postgres,
    )  # fmt: skip
    configure_logs("warning", "console")
    print(
        f"soak: {args.minutes:g} min, offered {shape.jobs_until(args.minutes * 60):,} jobs "
        f"({args.rate:g}/s, bursts of {args.burst_rate:g}/s for {args.burst_seconds:g} s every "
        f"{args.burst_every:g} s), retention {args.retention}; writing {plan.out}"
    )
    results = run_soak(plan, log=functools.partial(print, flush=True))
    if not results["ok"]:
        raise SystemExit(1)

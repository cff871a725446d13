"""The benchmark's command line.

    python -m bench run [--quick] [--peers arq,rq,celery,dramatiq,saq,bullmq|none]
                        [--scenarios ingest,drain,latency,delay,scale,memory] [--out DIR]
    python -m bench report DIR [--merge OTHER_DIR]

Sets up everything itself (private redis-servers, PostgreSQL, dispatchers, each peer's venv or npm
folder under .bench-cache/) and writes results.json, results.md and PNG plots to
bench/results/<date>/ unless --out says otherwise. ``--peers none --scenarios drain`` measures one
scenario for shardq alone, which is what an optimisation loop wants; ``report DIR --merge OTHER``
folds such a run's figures into a full run's results and rewrites its table and plots.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from shardq_common.logs import configure as configure_logs

from .run import Plan, merge, rewrite, run
from .sizes import FULL, QUICK
from .systems import ALL_SCENARIOS, PEERS

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


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=formatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("run", help="run the benchmark", description=__doc__, formatter_class=formatter)
    cmd.add_argument(
        "--quick", action="store_true", help="small sizes: a shardq-only run in well under a minute"
    )
    cmd.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers, or none")
    cmd.add_argument("--scenarios", default=",".join(ALL_SCENARIOS), help="comma-separated scenarios")
    cmd.add_argument("--out", type=Path, help="output folder (default bench/results/<YYYY-MM-DD>)")
    cmd.add_argument(
        "--dispatcher-processes", type=int, default=2,
        help="shardq dispatcher processes (default 2: `dispatcher run`'s default, the CPU count, on 2 cores)",
    )  # fmt: skip
    report = commands.add_parser(
        "report",
        help="rewrite results.md and the plots of a run, optionally folding in another run's figures",
    )
    report.add_argument("out", type=Path, help="the run's folder (with results.json)")
    report.add_argument("--merge", type=Path, help="another run's folder whose figures replace the same ones")
    args = parser.parse_args(argv)
    if args.command == "report":
        _report(args.out, args.merge)
        return
    plan = Plan(
        scenarios=_choices(args.scenarios, ALL_SCENARIOS, "scenarios"),
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


def _report(out: Path, other: Path | None) -> None:
    if other is not None:
        merge(out, other)
    else:
        rewrite(out)
    print(f"rewrote {out / 'results.md'}")

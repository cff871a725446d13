"""The soak's samples: what each one holds, their CSV file, and the table and plot that show them."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

#: the series whose flatness the verdict judges: name, label
RESOURCES = [
    ("db_bytes", "DB size (tables + indexes)"),
    ("rows", "jobs rows"),
    ("redis_bytes", "Redis used_memory"),
    ("dispatcher_rss", "dispatcher RSS"),
    ("worker_rss", "worker RSS"),
]
LATENCIES = [("p50_ms", "enqueue-to-start p50"), ("p99_ms", "enqueue-to-start p99")]


@dataclass
class Sample:
    t: float
    db_bytes: int
    rows: int
    dead_rows: int  # dead tuples autovacuum has yet to clear (PostgreSQL's estimate)
    redis_bytes: int
    dispatcher_rss: int
    worker_rss: int
    p50_ms: float | None
    p99_ms: float | None
    ingest_per_s: float
    drain_per_s: float
    prune_per_s: float


def write_csv(path: Path, samples: list[Sample]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f.name for f in fields(Sample)])
        for s in samples:
            writer.writerow(asdict(s).values())


#: columns a run's samples.csv may lack (written before they were sampled), and what they read as
_ADDED_LATER = {"dead_rows": "0"}


def read_csv(path: Path) -> list[Sample]:
    """The samples a run wrote, to judge them again. Raises ValueError naming a missing column."""
    kinds = {f.name: (float if f.type in ("float", "float | None") else int) for f in fields(Sample)}
    samples = []
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            row = {**_ADDED_LATER, **row}
            missing = [name for name in kinds if name not in row]
            if missing:
                raise ValueError(f"{path}: no column {', '.join(missing)}")
            try:
                values = {k: None if row[k] == "" else kinds[k](float(row[k])) for k in kinds}
            except ValueError:
                raise ValueError(f"{path}, line {line}: a value that is not a number") from None
            samples.append(Sample(**values))  # type: ignore[arg-type]
    return samples


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def table(samples: list[Sample]) -> list[str]:
    lines = [
        "| t (s) | DB MB | rows | dead rows | Redis MB | dispatcher RSS MB | worker RSS MB | p50 ms "
        "| p99 ms | ingest/s | drain/s | prune/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in samples:
        lines.append(
            f"| {s.t:.0f} | {_mb(s.db_bytes)} | {s.rows:,} | {s.dead_rows:,} | {_mb(s.redis_bytes)} "
            f"| {_mb(s.dispatcher_rss)} "
            f"| {_mb(s.worker_rss)} | {_ms(s.p50_ms)} | {_ms(s.p99_ms)} | {s.ingest_per_s:,.0f} "
            f"| {s.drain_per_s:,.0f} | {s.prune_per_s:,.0f} |"
        )
    return lines


def plot(path: Path, samples: list[Sample], title: str) -> str | None:
    """The plot, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    t = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    panels: list[tuple[Any, list[tuple[str, str, float]], str]] = [
        (axes[0][0], [("db_bytes", "DB size", 1e6)], "MB"),
        (
            axes[0][1],
            [("rows", "jobs rows", 1e3), ("dead_rows", "dead rows (not yet vacuumed)", 1e3)],
            "thousand",
        ),
        (axes[1][0], [("redis_bytes", "Redis used_memory", 1e6)], "MB"),
        (axes[1][1], [("dispatcher_rss", "dispatcher RSS", 1e6), ("worker_rss", "worker RSS", 1e6)], "MB"),
        (axes[2][0], [("p50_ms", "enqueue-to-start p50", 1), ("p99_ms", "p99", 1)], "ms"),
        (
            axes[2][1],
            [("ingest_per_s", "ingest", 1), ("drain_per_s", "drain", 1), ("prune_per_s", "prune", 1)],
            "jobs/s",
        ),
    ]
    for ax, series, unit in panels:
        for name, label, scale in series:
            values = [getattr(s, name) for s in samples]
            ax.plot(t, [None if v is None else v / scale for v in values], label=label)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        end = t[-1] if t else 0
        for edge in (end / 3, 2 * end / 3):
            ax.axvline(edge, color="grey", linestyle=":", linewidth=0.8)
    axes[2][1].set_yscale("symlog", linthresh=100)
    axes[2][1].set_ylim(bottom=0)
    for ax in axes[2]:
        ax.set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None

"""PNG plots: throughput bars per system, and start-lag CDFs per scenario phase. matplotlib is the
optional ``bench`` extra; without it the run writes its results and says there are no plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

THROUGHPUT = [
    ("ingest", "one_jobs_per_s", "ingest, one at a time"),
    ("ingest", "pipelined_jobs_per_s", "ingest, one per call, 64 in flight"),
    ("ingest", "bulk_jobs_per_s", "ingest, bulk"),
    ("drain", "jobs_per_s", "drain, no-op jobs"),
    ("drain-redis", "jobs_per_s", "drain, a Redis round trip per job"),
    ("drain-io1ms", "jobs_per_s", "drain, 1 ms of I/O per job"),
    ("drain-cpu100us", "jobs_per_s", "drain, ~100 µs of CPU per job"),
]
#: panels per row of the throughput figure
COLUMNS = 4


def write_plots(
    out: Path, results: dict[str, Any], samples: dict[str, dict[str, list[float]]]
) -> dict[str, Any]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        note = "matplotlib is not installed (pip install -e '.[bench]'): results written without plots"
        return {"files": [], "notes": [note]}
    files = []
    if _throughput(plt, out / "throughput.png", results):
        files.append("throughput.png")
    if _latency_cdfs(plt, out / "latency_cdf.png", samples):
        files.append("latency_cdf.png")
    return {"files": files, "notes": []}


def _throughput(plt: Any, path: Path, results: dict[str, Any]) -> bool:
    panels = []
    for scenario, key, title in THROUGHPUT:
        bars = {name: s["scenarios"][scenario][key] for name, s in results["systems"].items()
                if key in s.get("scenarios", {}).get(scenario, {})}  # fmt: skip
        if bars:
            panels.append((title, bars))
    if not panels:
        return False
    columns = min(COLUMNS, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, bars) in zip(axes.flat, panels, strict=False):
        colours = ["tab:red" if name.startswith("shardq") else "tab:blue" for name in bars]
        ax.bar(list(bars), list(bars.values()), color=colours)
        ax.set_title(title)
        ax.set_ylabel("jobs/s")
        ax.tick_params(axis="x", rotation=45)
        for i, value in enumerate(bars.values()):
            ax.annotate(f"{value:,.0f}", (i, value), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _latency_cdfs(plt: Any, path: Path, samples: dict[str, dict[str, list[float]]]) -> bool:
    names = sorted({name for per_system in samples.values() for name in per_system})
    if not names:
        return False
    columns = min(2, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.5 * rows), squeeze=False)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        for system, per_system in samples.items():
            values = sorted(max(v, 0.01) for v in per_system.get(name, []))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, fractions, label=system, linewidth=2.2 if system == "shardq" else 1.2)
        ax.set_xscale("log")
        ax.set_title(f"{name}: start lag CDF")
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("fraction of jobs started")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

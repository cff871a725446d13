"""results.md: systems as columns, scenarios as rows, and shardq against the best peer per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .rows import Row, table_rows

SHARDQ = "shardq"


def _cell(row: Row, system: dict[str, Any]) -> str:
    value = row.value(system)
    if value is None and (note := row.note(system)):
        return note
    if value is None:
        if row.scenario in system.get("errors", {}) or "error" in system:
            return "error"
        return "—"
    return f"{value:,.{row.digits}f}"


def _ratio(row: Row, systems: dict[str, Any]) -> str:
    """shardq / best peer (best: the highest or the lowest, as the row says)."""
    if not row.better or SHARDQ not in systems:
        return ""
    ours = row.value(systems[SHARDQ])
    peers = [
        v for name, s in systems.items() if not name.startswith(SHARDQ) if (v := row.value(s)) is not None
    ]
    if ours is None or not peers:
        return ""
    best = max(peers) if row.better == "higher" else min(peers)
    return f"{ours / best:.2f}x" if best else ""


def render(results: dict[str, Any]) -> str:
    systems = results["systems"]
    rows = [row for row in table_rows(results["sizes"]) if row.scenario in results["scenarios"]]
    names = list(systems)
    lines = [
        "| scenario | " + " | ".join(names) + " | shardq / best peer |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: |",
    ]
    for row in rows:
        arrow = {"higher": " ↑", "lower": " ↓"}.get(row.better, "")
        cells = [_cell(row, systems[name]) for name in names]
        lines.append(f"| {row.label}{arrow} | " + " | ".join(cells) + f" | {_ratio(row, systems)} |")
    return "\n".join(lines) + "\n"


def _notes(results: dict[str, Any]) -> list[str]:
    machine = results["machine"]
    source = results.get("shardq_source", {})
    notes = [
        f"Machine: {machine['cpu_model']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"{machine['os']}, Python {machine['python']}, Node {machine['node']}.",
        f"Run: `{results['command']}`, {results['started_at']} to {results.get('finished_at', '?')}"
        + (" (quick sizes)." if results["quick"] else "."),
        f"shardq measured at commit {source.get('commit', '?')}"
        + (" with uncommitted changes." if source.get("uncommitted_changes") else "."),
        "↑ higher is better, ↓ lower is better; the last column is shardq (PostgreSQL store) divided by the "
        "best peer on that row; — means not measured for that system (shardq-sqlite runs ingest only; "
        "scale and dispatcher RSS are shardq's).",
    ]
    if any("-" in scenario for scenario in results["scenarios"]):
        notes.append(
            "Rows with no-op jobs measure the queue's own cost per job: the handler only records its start. "
            "Rows naming a handler's work measure what jobs that do a little work get: one pipelined Redis "
            "round trip (INCR + SET, to the system's own Redis; async client in async workers, sync in "
            "sync ones), 1 ms of I/O wait, or about 100 µs of pure-Python CPU (JavaScript for BullMQ), "
            "each system at the worker concurrency a sweep found fastest for that work "
            "(`python -m bench sweep`; the values used are below)."
        )
    for merged in results.get("merged", []):
        replaced = "; ".join(f"{n}: {', '.join(s)}" for n, s in merged["replaced"].items())
        run = f"`{merged['command']}`, {merged['started_at']}"
        notes.append(f"Measured again and merged in: {replaced} ({run}).")
    for name, system in results["systems"].items():
        versions = ", ".join(f"{k} {v}" for k, v in system.get("versions", {}).items())
        if versions:
            notes.append(f"{name}: {versions}; Redis {system.get('redis_version', '?')}.")
        if "error" in system:
            notes.append(f"{name}: {system['error'].splitlines()[0]}")
        if used := _concurrency_used(system):
            means = system.get("settings", {}).get("worker_concurrency_means", "worker concurrency")
            notes.append(f"{name} workers ({means}): {used}.")
        for scenario, figures in system.get("scenarios", {}).items():
            if figures.get("capped"):
                stopped = f"stopped {figures['max_seconds']:g} s after its first start"
                notes.append(
                    f"{name} {scenario}: {stopped}, {figures['started']:,} of {figures['jobs']:,} started."
                )
        for scenario, error in system.get("errors", {}).items():
            notes.append(f"{name} {scenario}: {error.splitlines()[-1][:300]}")
    return notes


def _concurrency_used(system: dict[str, Any]) -> str:
    """Each kind of work's concurrency, as the scenarios ran it, e.g. "no-op jobs 200, redis 50"."""
    used: dict[str, set[int]] = {}
    for figures in system.get("scenarios", {}).values():
        if "worker_concurrency" in figures:
            used.setdefault(figures["work"], set()).add(figures["worker_concurrency"])
    names = {"noop": "no-op jobs"}
    return ", ".join(f"{names.get(work, work)} {'/'.join(f'{c:,}' for c in sorted(values))}"
                     for work, values in used.items())  # fmt: skip


def write_markdown(path: Path, results: dict[str, Any]) -> None:
    body = render(results) + "\n" + "\n".join(f"- {note}" for note in _notes(results)) + "\n"
    path.write_text(body)

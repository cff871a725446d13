"""`dispatcherctl job show ID --graph`: a job's workflow (issue 21) drawn as text: what it waits for,
up the graph, and what waits for it, down the graph, each job with its type and status."""

from __future__ import annotations

from collections.abc import Callable

from worker_sdk import Client, DependencyInfo, JobInfo

#: Jobs read at most to draw one graph (each is a GetJob): a bigger graph is cut, and says so.
MAX_NODES = 200


def draw(client: Client, job: JobInfo, max_nodes: int = MAX_NODES) -> str:
    read: dict[str, JobInfo] = {job.id: job}

    def fetch(job_id: str) -> JobInfo | None:
        if job_id not in read:
            if len(read) >= max_nodes:
                return None
            read[job_id] = client.get_job(job_id)
        return read[job_id]

    lines = ["waits for:"]
    lines += _tree(job, lambda j: j.dependencies, fetch, set()) or ["  (nothing)"]
    lines.append(
        f"* {_label(job)}" + (f"  ({job.dependencies_remaining} open)" if job.status == "waiting" else "")
    )
    lines.append("waited for by:")
    lines += _tree(job, lambda j: j.dependents, fetch, set()) or ["  (nothing)"]
    if len(read) >= max_nodes:
        lines.append(f"(cut at {max_nodes} jobs)")
    return "\n".join(lines)


def _label(job: JobInfo) -> str:
    return f"{job.id} {job.type} {job.status}"


def _edge(e: DependencyInfo) -> str:
    resolved = f", ended {e.resolved_state}" if e.resolved_state else ""
    return f"{e.job_id} {e.type or '?'} {e.status} [{e.on_failure}{resolved}]"


def _tree(
    job: JobInfo,
    edges: Callable[[JobInfo], tuple[DependencyInfo, ...]],
    fetch: Callable[[str], JobInfo | None],
    seen: set[str],
    indent: str = "  ",
) -> list[str]:
    out = []
    items = edges(job)
    for i, e in enumerate(items):
        last = i == len(items) - 1
        out.append(f"{indent}{'└─' if last else '├─'} {_edge(e)}")
        if e.job_id in seen:
            out[-1] += " (above)"
            continue
        seen.add(e.job_id)
        below = fetch(e.job_id) if e.status != "deleted" else None
        if below is not None:
            out += _tree(below, edges, fetch, seen, indent + ("   " if last else "│  "))
    return out

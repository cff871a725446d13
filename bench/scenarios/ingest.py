"""Ingest: jobs/s enqueued from one process: one call per job (awaited one after another, and up to 64
at a time), and through the bulk API."""

from __future__ import annotations

from .context import Outcome, ScenarioContext


def run(ctx: ScenarioContext) -> Outcome:
    sizes = ctx.sizes
    figures = {}
    with ctx.stack() as stack:
        modes = (
            ("one", sizes.ingest_one_jobs),
            ("pipelined", sizes.ingest_one_jobs),
            ("bulk", sizes.ingest_bulk_jobs),
        )
        for mode, jobs in modes:
            params = {
                "mode": mode,
                "jobs": jobs,
                "batch": sizes.batch,
                "max_seconds": sizes.ingest_max_seconds,
            }
            result = stack.call("ingest", params, sizes.ingest_max_seconds + 120)
            figures[f"{mode}_jobs"] = result["jobs"]
            figures[f"{mode}_jobs_per_s"] = result["jobs"] / result["seconds"]
            figures[f"{mode}_capped"] = result["jobs"] < jobs
    figures["batch"] = sizes.batch
    return Outcome(figures)

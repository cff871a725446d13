"""The resolution of dependencies in the DB (issue 21, store/dependencies.py), on both stores:
exactly one promotion per waiting job when its last two dependencies finish at the same instant in
two processes, and, over random graphs, outcomes and batchings, a job released only once every
dependency finished, once, or cancelled under 'fail' (hypothesis); a job's dependency results read
in id order up to their bound, and none past it read at all."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.store import JobRow, Store, StoreUpdate, open_store
from dispatcher.store.dependencies import Edge
from tests.support.db import graph_row

ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()


# One process: at the given wall instant, record the ends of these jobs in one status batch and
# print the ids that batch released.
_FINISHER = """
import asyncio, json, sys, time
from dispatcher.store import JobRow, StoreUpdate, open_store

async def main(url, at, ids):
    store = await open_store(url)
    released = []
    store.on_resolved = lambda promoted, cancelled: released.extend(r.id for r in promoted)
    time.sleep(max(0.0, at - time.time()))
    await store.apply_updates([StoreUpdate(i, "succeeded", finished_at=1, result=i.encode()) for i in ids])
    await store.close()
    print(json.dumps(released))

asyncio.run(main(sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])))
"""


async def test_two_processes_finishing_the_last_two_dependencies_at_once_promote_once(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        await store.migrate()
        for round_ in range(3):
            n = 60
            left = [f"r{round_}-left-{i:03d}" for i in range(n)]
            right = [f"r{round_}-right-{i:03d}" for i in range(n)]
            waiting = [f"r{round_}-wait-{i:03d}" for i in range(n)]
            rows = [*map(graph_row, left), *map(graph_row, right), *(graph_row(w, 2) for w in waiting)]
            edges = [e for i, w in enumerate(waiting) for e in (Edge(w, left[i]), Edge(w, right[i]))]
            await store.insert_graph(rows, edges, lambda t: True, str)
            at = time.time() + 1.5  # both processes connected and waiting by then
            procs = [  # started at once, then waited for: the event loop has nothing else to do
                subprocess.Popen(  # noqa: ASYNC220
                    [sys.executable, "-c", _FINISHER, db_url, str(at), json.dumps(ids)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for ids in (left, right)
            ]
            released = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
            assert all(p.returncode == 0 for p in procs)
            together = released[0] + released[1]
            assert sorted(together) == waiting  # each once, by one process or the other
            async with store.transaction() as tx:
                states = await tx.execute(
                    "SELECT status, deps_remaining, COUNT(*) FROM jobs WHERE id LIKE ? "
                    "GROUP BY status, deps_remaining",
                    (f"r{round_}-wait-%",),
                )
            assert [tuple(r) for r in states] == [("ready", 0, n)]
            results = (await store.dependency_results([waiting[0]], 1 << 20))[waiting[0]]
            assert [(r[0], r[2], r[3]) for r in results] == [
                (left[0], "succeeded", left[0].encode()),
                (right[0], "succeeded", right[0].encode()),
            ]
    finally:
        await store.close()


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, str]], list[str], list[int]]:
    """A DAG over n jobs (edges from a later job to an earlier one), each edge's policy, each job's
    outcome when it runs, and the batch sizes its ends are recorded in."""
    n = draw(st.integers(2, 9))
    edges = []
    for j in range(1, n):
        for d in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            edges.append((j, d, draw(st.sampled_from(["fail", "ignore"]))))
    outcomes = draw(
        st.lists(st.sampled_from(["succeeded", "succeeded", "dead", "cancelled"]), min_size=n, max_size=n)
    )
    batches = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
    return n, edges, outcomes, batches


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=_graphs())
def test_random_graphs_release_each_job_once_after_all_its_dependencies(tmp_path: Path, graph) -> None:
    asyncio.run(_run_graph(f"sqlite:///{tmp_path}/g.sqlite3", graph))


async def _run_graph(url: str, graph: tuple[int, list[tuple[int, int, str]], list[str], list[int]]) -> None:
    n, edges, outcomes, batches = graph
    store = await open_store(url)
    try:
        await store.migrate()
        prefix = f"g{next(_ids)}-"
        ids = [f"{prefix}{i}" for i in range(n)]
        deps: dict[int, list[tuple[int, str]]] = {j: [] for j in range(n)}
        for j, d, policy in edges:
            deps[j].append((d, policy))
        released: list[str] = []
        cancelled_by_deps: list[str] = []

        def on_resolved(promoted: list[JobRow], cancelled: list[str]) -> None:
            released.extend(r.id for r in promoted)
            cancelled_by_deps.extend(cancelled)

        store.on_resolved = on_resolved
        rows = [graph_row(ids[j], len(deps[j])) for j in range(n)]
        await store.insert_graph(rows, [Edge(ids[j], ids[d], p) for j, d, p in edges], lambda t: True, str)
        finished: dict[int, str] = {}
        runnable = [j for j in range(n) if not deps[j]]
        turn = 0
        while runnable:
            size = batches[turn % len(batches)]
            turn += 1
            batch, runnable = runnable[:size], runnable[size:]
            for j in batch:  # every dependency finished before it was released
                assert all(d in finished for d, _ in deps[j]), (j, deps[j], finished)
            updates = [StoreUpdate(ids[j], outcomes[j], finished_at=1) for j in batch]
            updates += updates[:1]  # a duplicate end (another process's late write) changes nothing
            before = len(released)
            await store.apply_updates(updates)
            finished.update((j, outcomes[j]) for j in batch)
            finished.update((int(i.removeprefix(prefix)), "cancelled") for i in cancelled_by_deps)
            runnable += [int(i.removeprefix(prefix)) for i in released[before:]]
        assert len(released) == len(set(released))  # each released once
        async with store.transaction() as tx:
            status = dict(await tx.execute("SELECT id, status FROM jobs WHERE id LIKE ?", (f"{prefix}%",)))
        for j in range(n):
            if ids[j] in cancelled_by_deps:
                assert status[ids[j]] == "cancelled"
                # Under 'fail', a dependency that failed (or was itself cancelled for one)
                assert any(p == "fail" and (finished.get(d, "cancelled") != "succeeded") for d, p in deps[j])
            else:  # it ran: nothing it waited for under 'fail' failed
                assert status[ids[j]] == outcomes[j], (j, status[ids[j]])
                assert all(finished[d] == "succeeded" for d, p in deps[j] if p == "fail")
        assert "waiting" not in status.values()
    finally:
        await store.close()


async def test_dependency_results_come_in_id_order_up_to_the_bound_and_the_rest_is_never_read(
    store: Store,
) -> None:
    deps = [f"fan-{i:03d}" for i in range(40)]
    await store.insert_graph(
        [*map(graph_row, deps), graph_row("fan-in", len(deps))],
        [Edge("fan-in", d) for d in deps],
        lambda t: True,
        str,
    )
    size, bound, empty = 32 << 10, 100_000, 5
    results = [b"" if i == empty else bytes([65 + i % 26]) * size for i in range(len(deps))]
    await store.apply_updates(
        [StoreUpdate(d, "succeeded", finished_at=1, result=r) for d, r in zip(deps, results, strict=True)]
    )
    tracemalloc.start()
    try:
        got = (await store.dependency_results(["fan-in"], max_bytes=bound))["fan-in"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r[0] for r in got] == deps
    fit = bound // size  # the first three: 96 KiB of the 100,000 bytes
    assert [r[3] for r in got[:fit]] == results[:fit]
    assert all(r[3] == b"" for r in got[fit:])
    # Past the bound every result is cut, whatever its size; an empty one is not marked.
    assert [r[4] for r in got] == [i >= fit and i != empty for i in range(len(deps))]
    # The 1.2 MiB of results past the bound stayed in the database.
    assert peak < len(deps) * size // 2, peak

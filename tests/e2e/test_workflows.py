"""Workflows end to end (issue 21): jobs that wait for other jobs. Real dispatcher and worker
processes, Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.queue.failpoints import CRASH_EXIT_CODE
from tests.support.db import query
from tests.support.ports import free_port
from tests.support.processes import ROOT, read_ledger
from tests.support.scrape import metric_total, samples
from tests.support.wait import wait_until
from worker_sdk import Batch, Client, InvalidArgumentError, JobFilter, JobInfo, chain, group, job


def _status(client: Client, job_id: str, status: str, timeout: float = 20) -> JobInfo:
    return wait_until(
        lambda: (job := client.get_job(job_id)).status == status and job,
        timeout=timeout,
        message=lambda: f"{job_id}: {client.get_job(job_id).status}, expected {status}",
    )


def _times(ledger: Path, event: str) -> dict[str, float]:
    return {e["job"]: e["t"] for e in read_ledger(ledger) if e["event"] == event}


def test_a_fan_in_waits_for_every_dependency_and_runs_once(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="sleep,noop")
    with Client(dispatcher.target) as client:
        a, b, c, d = client.enqueue_many(
            [
                {"type": "sleep", "payload": {"sleep": 1.0}, "ref": "a"},
                {"type": "noop", "payload": {"result_hex": "6869"}, "ref": "b"},
                {"type": "noop", "ref": "c", "depends_on": ["a", "b"]},
                {"type": "noop", "depends_on": ["c"]},
            ]
        )
        waiting = client.get_job(c)
        assert waiting.status == "waiting"
        assert waiting.dependencies_remaining >= 1
        assert {e.job_id for e in waiting.dependencies} == {a, b}
        assert [e.job_id for e in client.get_job(d).dependencies] == [c]
        _status(client, d, "succeeded")
        shown = client.get_job(c)
        assert {(e.job_id, e.resolved_state) for e in shown.dependencies} == {
            (a, "succeeded"),
            (b, "succeeded"),
        }
        assert [(e.job_id, e.status) for e in shown.dependents] == [(d, "succeeded")]
        assert shown.dependencies_remaining == 0
    starts, ends = _times(ledger, "start"), _times(ledger, "end")
    assert starts[c] >= max(ends[a], ends[b])
    assert starts[d] >= ends[c]
    runs = [e["job"] for e in read_ledger(ledger) if e["event"] == "start"]
    assert sorted(runs) == sorted([a, b, c, d])  # each once


def test_a_dependency_that_finished_already_releases_at_once(dispatcher, start_worker):
    start_worker(dispatcher.target, types="noop")
    with Client(dispatcher.target) as client:
        first = client.enqueue("noop")
        _status(client, first, "succeeded")
        second = client.enqueue("noop", depends_on=[first])
        _status(client, second, "succeeded")


def test_a_dead_dependency_cancels_under_fail_and_runs_under_ignore(dispatcher, start_worker, db_url):
    start_worker(dispatcher.target, types="final,noop")
    with Client(dispatcher.target) as client:
        dead, failing, below, ignoring = client.enqueue_many(
            [
                {"type": "final", "ref": "dead"},
                {"type": "noop", "ref": "failing", "depends_on": ["dead"]},
                {"type": "noop", "depends_on": ["failing"]},
                {"type": "noop", "depends_on": [("dead", "ignore")]},
            ]
        )
        _status(client, dead, "dead")
        for job_id in (failing, below):  # the cancel cascades
            job = _status(client, job_id, "cancelled")
            assert job.last_error.startswith("dependency_failed")
        assert dead in client.get_job(failing).last_error
        ran = _status(client, ignoring, "succeeded")
        assert [(e.job_id, e.resolved_state) for e in ran.dependencies] == [(dead, "dead")]
    assert query(db_url, "SELECT COUNT(*) FROM job_dependencies WHERE resolved_state IS NULL") == [(0,)]


def test_cancelling_a_job_cancels_what_waits_for_it(dispatcher, start_worker):
    with Client(dispatcher.target) as client:  # no worker yet: the first job stays ready
        first, second, third = client.enqueue_many(
            [
                {"type": "noop", "ref": "1"},
                {"type": "noop", "ref": "2", "depends_on": ["1"]},
                {"type": "noop", "depends_on": ["2"]},
            ]
        )
        assert client.cancel(second) == "cancelled"  # a waiting job
        _status(client, third, "cancelled")
        start_worker(dispatcher.target, types="noop")
        _status(client, first, "succeeded")
        assert client.get_job(second).status == "cancelled"


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            [
                {"type": "noop", "ref": "x", "depends_on": ["y"]},
                {"type": "noop", "ref": "y", "depends_on": ["x"]},
            ],
            "jobs[0] ('x').depends_on: the dependencies form a cycle",
        ),
        (
            [{"type": "noop", "ref": "x", "depends_on": ["x"]}],
            "jobs[0].depends_on[0]: the job depends on itself",
        ),
        (
            [{"type": "noop"}, {"type": "noop", "depends_on": ["01JZZZZZZZZZZZZZZZZZZZZZZZ"]}],
            "jobs[1].depends_on[0].job: no job 01JZZZZZZZZZZZZZZZZZZZZZZZ",
        ),
        ([{"type": "noop", "ref": "x"}, {"type": "noop", "ref": "x"}], "jobs[1].ref: 'x' is already the ref"),
    ],
    ids=["cycle", "self", "unknown", "duplicate-ref"],
)
def test_bad_graphs_are_refused_and_nothing_is_written(dispatcher, db_url, specs, message):
    with Client(dispatcher.target) as client:
        with pytest.raises(InvalidArgumentError, match=re.escape(message)):
            client.enqueue_many(specs)
    assert query(db_url, "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert query(db_url, "SELECT COUNT(*) FROM job_dependencies") == [(0,)]


def test_a_fan_in_reads_every_dependency_result_and_an_ignored_failure(dispatcher, start_worker):
    start_worker(dispatcher.target, types="noop,final,collect")
    with Client(dispatcher.target) as client:
        children = [
            {"type": "noop", "payload": {"result_hex": f"{i:04x}"}, "ref": f"c{i}"} for i in range(20)
        ]
        *child_ids, dead, callback = client.enqueue_many(
            [
                *children,
                {"type": "final", "ref": "dead"},
                {"type": "collect", "depends_on": [*(f"c{i}" for i in range(20)), ("dead", "ignore")]},
            ]
        )
        _status(client, callback, "succeeded")
        seen = json.loads(client.get_job(callback).result)
        # The dispatcher's mark is never shown (a trace context, when tracing is on, is the client's).
        assert not {h for h in client.get_job(callback).headers if h.startswith(":")}
    expected = {job_id: ["noop", "succeeded", f"{i:04x}"] for i, job_id in enumerate(child_ids)}
    expected[dead] = ["final", "dead", ""]
    assert seen == expected


def test_a_chain_runs_in_order_and_passes_each_result_on(dispatcher, start_worker, ledger):
    start_worker(dispatcher.target, types="noop,collect")
    with Client(dispatcher.target) as client:
        first, second, third = client.enqueue_many(
            chain(job("noop", {"result_hex": "01"}), job("collect"), job("collect"))
        )
        _status(client, third, "succeeded")
        assert json.loads(client.get_job(second).result) == {first: ["noop", "succeeded", "01"]}
        passed_on = json.loads(client.get_job(third).result)
        assert list(passed_on) == [second] and passed_on[second][1] == "succeeded"
    starts, ends = _times(ledger, "start"), _times(ledger, "end")
    assert ends[first] <= starts[second] and ends[second] <= starts[third]


def test_a_group_of_500_then_a_callback_that_receives_all_500_results(dispatcher, start_worker):
    start_worker(dispatcher.target, types="noop,collect", concurrency=64)
    with Client(dispatcher.target) as client:
        children = [job("noop", {"result_hex": f"{i:04x}"}) for i in range(500)]
        *child_ids, callback = client.enqueue_many(group(children, key="report-1").then(job("collect")))
        job_info = _status(client, callback, "succeeded", timeout=60)
        seen = json.loads(job_info.result)
        assert seen == {c: ["noop", "succeeded", f"{i:04x}"] for i, c in enumerate(child_ids)}
        # The same group again (a retried call): its key makes it the same jobs, created once.
        again = client.enqueue_many(group(children, key="report-1").then(job("collect")))
        assert again == [*child_ids, callback]


def test_a_batch_fires_complete_and_success_once_and_waits_for_jobs_added_from_inside(
    dispatcher, start_worker, ledger
):
    start_worker(dispatcher.target, types="noop,sleep,grow,collect")
    with Client(dispatcher.target) as client:
        batch = Batch(on_success=job("collect", ref="success"), on_complete=job("collect", ref="complete"))
        opened = client.enqueue_batch(batch, [job("noop"), job("sleep", {"sleep": 0.3})])
        grower = client.add_to_batch(
            opened,
            [
                job(
                    "grow",
                    {
                        "target": dispatcher.target,
                        "batch": opened.token,
                        "add": [job("sleep", {"sleep": 1.5})],
                    },
                )
            ],
        )[0]
        _status(client, opened.complete_id, "succeeded", timeout=30)
        _status(client, opened.success_id, "succeeded")
        [added] = json.loads(client.get_job(grower).result)
        members = {*opened.job_ids, grower, added}
        assert set(json.loads(client.get_job(opened.success_id).result)) == members
    starts, ends = _times(ledger, "start"), _times(ledger, "end")
    assert starts[opened.success_id] >= ends[added]  # not early: the added job was waited for
    runs = [e["job"] for e in read_ledger(ledger) if e["event"] == "start"]
    assert runs.count(opened.success_id) == 1 and runs.count(opened.complete_id) == 1


def test_a_batch_with_a_dead_job_completes_without_success(dispatcher, start_worker):
    start_worker(dispatcher.target, types="noop,final,collect")
    with Client(dispatcher.target) as client:
        batch = Batch(on_success=job("collect"), on_complete=job("collect"))
        opened = client.enqueue_batch(batch, [job("noop"), job("final")])
        done = _status(client, opened.complete_id, "succeeded")
        assert sorted(state for _, state, _ in json.loads(done.result).values()) == ["dead", "succeeded"]
        assert client.get_job(opened.success_id).status == "cancelled"
        # The batch is closed: nothing may join it now.
        with pytest.raises(InvalidArgumentError, match="no longer waiting"):
            client.add_to_batch(opened, [job("noop")])


def test_dispatcherctl_draws_a_job_graph(dispatcher):
    with Client(dispatcher.target) as client:  # no worker: the graph stays as enqueued
        a, b, c, d = client.enqueue_many(
            [
                {"type": "noop", "ref": "a"},
                {"type": "noop", "ref": "b"},
                {"type": "collect", "ref": "c", "depends_on": ["a", ("b", "ignore")]},
                {"type": "collect", "depends_on": ["c"]},
            ]
        )
    env = {k: v for k, v in os.environ.items() if k != "SHARDQ_TARGET"}
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.ctl",
            "--target",
            dispatcher.target,
            "job",
            "show",
            c,
            "--graph",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    first, second = sorted([(a, "fail"), (b, "ignore")])  # listed in id order
    assert shown.stdout.splitlines() == [
        "waits for:",
        f"  ├─ {first[0]} noop ready [{first[1]}]",
        f"  └─ {second[0]} noop ready [{second[1]}]",
        f"* {c} collect waiting  (2 open)",
        "waited for by:",
        f"  └─ {d} collect waiting [fail]",
    ]


def test_the_waiting_jobs_are_counted_in_a_metric(start_dispatcher, redis_url, db_url, start_worker):
    port = free_port()
    proc = start_dispatcher(redis_url, db_url, metrics_listen=f"127.0.0.1:{port}")
    with Client(proc.target) as client:
        first, *_ = client.enqueue_many(
            [{"type": "noop", "ref": "a"}, *({"type": "noop", "depends_on": ["a"]} for _ in range(3))]
        )
        wait_until(
            lambda: metric_total(port, "shardq_jobs_waiting") == 3,
            timeout=20,
            message=lambda: [s for s in samples(port) if "waiting" in s.name or "dead" in s.name],
        )
        start_worker(proc.target, types="noop")
        wait_until(lambda: metric_total(port, "shardq_jobs_waiting") == 0, timeout=30)
        assert metric_total(port, "shardq_jobs_promoted_total") == 3


def test_waiting_jobs_are_found_by_a_search_and_cancelled_in_bulk(dispatcher):
    with Client(dispatcher.target) as client:  # no worker: the graph stays as enqueued
        first, *waiting = client.enqueue_many(
            [{"type": "noop", "ref": "a"}, *({"type": "noop.later", "depends_on": ["a"]} for _ in range(3))]
        )
        found = client.list_jobs(JobFilter(statuses=("waiting",)))
        assert sorted(j.id for j in found.jobs) == sorted(waiting)
        result = client.bulk_jobs("cancel", JobFilter(types=("noop.later",)))
        assert (result.matched, result.touched) == (3, 3)
        assert {client.get_job(j).status for j in waiting} == {"cancelled"}
        assert client.get_job(first).status == "ready"


def test_a_job_released_by_a_dispatcher_that_died_before_pushing_it_runs_on_the_next(
    start_dispatcher, start_worker, ledger, redis_url, db_url, tmp_path
):
    """The release is committed with its dependency's end; the push follows. A process that dies in
    between leaves a ready row Redis does not hold: the shard's next owner restores it, and it runs
    once."""
    doomed = start_dispatcher(redis_url, db_url, dispatcher_id="d1", failpoints="workflow.before-push")
    start_worker(doomed.target, types="noop")
    with Client(doomed.target) as client:
        first, then = client.enqueue_many(
            [{"type": "noop", "ref": "a"}, {"type": "noop", "depends_on": ["a"]}]
        )
    assert doomed.process is not None
    assert doomed.process.wait(30) == CRASH_EXIT_CODE, doomed.log_tail()
    assert query(db_url, "SELECT status FROM jobs WHERE id = ?", (then,)) == [("ready",)]  # committed
    successor = start_dispatcher(redis_url, db_url, dispatcher_id="d1")
    start_worker(successor.target, types="noop")
    with Client(successor.target) as client:
        _status(client, then, "succeeded")
    runs = [e["job"] for e in read_ledger(ledger) if e["event"] == "start"]
    assert runs.count(then) == 1 and runs.count(first) == 1


def test_two_dependencies_that_are_one_job_by_its_idempotency_key_release_the_waiting_job(
    dispatcher, start_worker
):
    """A ref of the request whose idempotency key an existing job holds is that job: named twice, it
    is one dependency, and the waiting job is released when it finishes (it used to count two edges
    and keep one: waiting forever)."""
    with Client(dispatcher.target) as client:
        existing = client.enqueue("noop", idempotency_key="the-one")
        _, waiter = client.enqueue_many(
            [
                {"type": "noop", "ref": "again", "idempotency_key": "the-one"},
                {"type": "collect", "depends_on": ["again", existing]},
            ]
        )
        start_worker(dispatcher.target, types="noop,collect")
        done = _status(client, waiter, "succeeded")
        assert list(json.loads(done.result)) == [existing]


def test_a_job_that_would_block_what_it_waits_for_is_refused(dispatcher, db_url):
    """``blocks`` makes an existing waiting job wait for the new one: refused when the new one waits
    for it already (directly or through its dependencies), or both would wait forever."""
    with Client(dispatcher.target) as client:  # no worker: everything stays as enqueued
        _, waiting = client.enqueue_many(
            [{"type": "noop", "ref": "a"}, {"type": "collect", "depends_on": ["a"]}]
        )
        before = (
            query(db_url, "SELECT COUNT(*) FROM jobs"),
            query(db_url, "SELECT COUNT(*) FROM job_dependencies"),
        )
        for specs in (
            [{"type": "noop", "depends_on": [waiting], "blocks": [waiting]}],
            [
                {"type": "noop", "ref": "down", "depends_on": [waiting]},
                {"type": "noop", "depends_on": ["down"], "blocks": [waiting]},
            ],
        ):
            with pytest.raises(InvalidArgumentError, match="a cycle"):
                client.enqueue_many(specs)
        assert (
            query(db_url, "SELECT COUNT(*) FROM jobs"),
            query(db_url, "SELECT COUNT(*) FROM job_dependencies"),
        ) == before


def test_jobs_added_to_a_batch_after_one_of_it_died_hold_up_its_completion(dispatcher, start_worker):
    """Once a job of the batch is dead its success callback is cancelled; the batch is still open
    until every job finished, so jobs added then are waited for by the completion callback (adding
    them used to be refused because the success callback no longer waited)."""
    start_worker(dispatcher.target, types="noop,final,sleep,collect")
    with Client(dispatcher.target) as client:
        batch = Batch(on_success=job("collect"), on_complete=job("collect"))
        opened = client.enqueue_batch(batch, [job("final"), job("sleep", {"sleep": 3})])
        _status(client, opened.success_id, "cancelled")
        [added] = client.add_to_batch(opened, [job("noop")])
        done = _status(client, opened.complete_id, "succeeded", timeout=30)
        assert added in json.loads(done.result)

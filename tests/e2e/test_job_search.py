"""The job search (ListJobs) end to end, on a real dispatcher, Redis and both stores: every filter,
payload fields (and payloads that are not JSON), keyset pages in both orders and their stability
while jobs are added, cursors of another search or altered refused, page bounds, bad filters
refused naming the field, the live state from Redis, type scopes, and ``dispatcherctl jobs list``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest

from shardq_common.clock import wall_ms
from shardq_common.tls import ChannelSecurity
from tests.support.db import query
from tests.support.processes import ROOT
from tests.support.wait import wait_until
from worker_sdk import Client, JobFilter, ShardqError

ADMIN = "search-admin-token-0001"
BILLING = "search-billing-token-01"
TOKENS = f"{ADMIN} role=admin;{BILLING} role=producer types=billing.*"


def ctl(target: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dispatcher.cli.ctl", "--target", target, *args]
    env = None
    if token:
        import os

        env = {**os.environ, "SHARDQ_TOKEN": token}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False, env=env)


def _ids(client: Client, job_filter: JobFilter | None = None, **options: object) -> list[str]:
    """Every id the search returns, paging through it (newest first unless asked)."""
    out: list[str] = []
    cursor = ""
    while True:
        page = client.list_jobs(job_filter, limit=3, cursor=cursor, **options)  # type: ignore[arg-type]
        out += [j.id for j in page.jobs]
        if not page.next_cursor:
            return out
        cursor = page.next_cursor


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        call()  # type: ignore[operator]
    except ShardqError as exc:
        return exc.code, exc.details
    raise AssertionError("the call was not refused")


def test_each_filter_selects_exactly_its_jobs(dispatcher, db_url):
    with Client(dispatcher.target) as client:
        t0 = wall_ms()
        charges = [
            client.enqueue("billing.charge", {"customer_id": i % 3, "n": i}, delay=3600) for i in range(6)
        ]
        refund = client.enqueue(
            "billing.refund", {"customer": {"id": "c-7"}}, priority="high", idempotency_key="refund-7"
        )
        time.sleep(0.01)
        t1 = wall_ms()
        emails = [client.enqueue("email.send", b"\xff\x00 not json", priority="low") for _ in range(2)]
        texts = [
            client.enqueue("email.send", payload)
            for payload in (b'"a string"', b"[1, 2]", b'{"customer_id": "1"}', b"{broken")
        ]
        assert client.cancel(charges[0]) == "cancelled"
        # A dead job with an error, and a finished time, as a worker's failure writes them.
        query(
            db_url,
            "UPDATE jobs SET status = 'dead', dead_reason = 'handler_error', finished_at = ?, "
            "last_error = ? WHERE id = ?",
            (t1, "Traceback ...\nValueError: card declined by issuer", charges[1]),
        )
        query(db_url, "UPDATE jobs SET schedule = 'nightly' WHERE id = ?", (charges[2],))

        everything = charges + [refund] + emails + texts
        assert _ids(client) == sorted(everything, reverse=True)
        assert _ids(client, oldest_first=True) == sorted(everything)

        def found(**fields: object) -> set[str]:
            return set(_ids(client, JobFilter(**fields)))  # type: ignore[arg-type]

        assert found(types=("billing.charge",)) == set(charges)
        assert found(types=("billing.*",)) == set(charges) | {refund}
        assert found(types=("billing.re?und", "email.send")) == {refund, *emails, *texts}
        assert found(types=("no.such",)) == set()
        assert found(statuses=("cancelled",)) == {charges[0]}
        assert found(statuses=("dead", "cancelled")) == {charges[0], charges[1]}
        assert found(priorities=("high",)) == {refund}
        assert found(priorities=("low", "high")) == {refund, *emails}
        assert found(created_before=t1 / 1000) == set(charges) | {refund}
        assert found(created_after=t1 / 1000) == set(emails + texts)
        assert found(created_after=t0 / 1000, created_before=t1 / 1000) == set(charges) | {refund}
        assert found(finished_after=t1 / 1000) == {charges[1], charges[0]}
        assert found(finished_before=t1 / 1000 + 0.001) == {charges[1]}
        # With a finished-time range, the order is the order they finished: charges[1] died at t1,
        # charges[0] was cancelled after.
        since = JobFilter(finished_after=t1 / 1000)
        assert _ids(client, since, oldest_first=True) == [charges[1], charges[0]]
        assert _ids(client, since) == [charges[0], charges[1]]
        assert _ids(client, JobFilter(finished_after=time.time() + 3600), oldest_first=True) == []
        assert found(idempotency_key="refund-7") == {refund}
        assert found(idempotency_key="refund-7", types=("email.send",)) == set()
        assert found(schedule="nightly") == {charges[2]}
        assert found(error_contains="card declined") == {charges[1]}
        assert found(error_contains="Card Declined") == set()  # case-sensitive
        assert found(error_contains="%") == found(error_contains="_") == set()  # no wildcards
        assert found(dead_reason="handler_error") == {charges[1]}
        # Payload fields: typed JSON equality; payloads that are not JSON objects never match.
        assert found(payload={"customer_id": 1}) == {charges[1], charges[4]}
        assert found(payload={"customer_id": 1.0}) == {charges[1], charges[4]}
        assert found(payload={"customer_id": "1"}) == {texts[2]}
        assert found(payload={"customer.id": "c-7"}) == {refund}
        assert found(payload={"payload.customer.id": "c-7"}) == {refund}
        assert found(payload={"customer_id": 0, "n": 3}) == {charges[3]}
        assert found(payload={"customer_id": None}) == set()
        assert found(payload={"missing": 1}) == set()
        assert found(types=("billing.charge",), statuses=("delayed",), payload={"customer_id": 2}) == {
            charges[2],
            charges[5],
        }

        total = client.list_jobs(JobFilter(types=("billing.*",)), with_total=True)
        assert (total.total, total.total_exact) == (7, True)
        assert client.list_jobs(limit=1).total is None


def test_pages_stay_stable_while_jobs_are_added_in_both_orders(dispatcher):
    with Client(dispatcher.target) as client:
        before = [client.enqueue("page.t", {"i": i}, delay=3600) for i in range(10)]
        for oldest_first in (False, True):
            seen: list[str] = []
            added: list[str] = []
            cursor = ""
            while True:
                page = client.list_jobs(
                    JobFilter(types=("page.t",)), limit=3, cursor=cursor, oldest_first=oldest_first
                )
                seen += [j.id for j in page.jobs]
                added.append(client.enqueue("page.t", {"added": True}, delay=3600))
                if not page.next_cursor:
                    break
                cursor = page.next_cursor
            assert len(seen) == len(set(seen)), "no job twice"
            if oldest_first:  # the jobs added meanwhile come after the others, in order
                assert seen[: len(before)] == sorted(before)
                assert seen == sorted(seen)
            else:  # newest first: what existed at the first page, nothing added since
                assert seen == sorted(before, reverse=True)
            before = sorted(set(before) | set(added))


def test_a_finished_time_range_pages_in_the_order_the_jobs_finished(dispatcher, db_url):
    """By finish time, then id: a job created first but finished last (delayed, then run) comes
    last oldest first, jobs that finished in the same millisecond keep their id order, and a page
    boundary inside such a tie loses and repeats nothing."""
    with Client(dispatcher.target) as client:
        jobs = [client.enqueue(f"done.t{i % 2}", {"i": i}, delay=3600) for i in range(9)]
        t = wall_ms() - 60_000
        # (status, finished_at) per job: the oldest job finished last; jobs 2..6 in one millisecond.
        finished = [("succeeded", t + 50)] + [("dead", t + 1)] + [("succeeded", t + 10)] * 5
        finished += [("cancelled", t + 20), ("succeeded", t + 5)]
        for job_id, (status, at) in zip(jobs, finished, strict=True):
            query(db_url, "UPDATE jobs SET status = ?, finished_at = ? WHERE id = ?", (status, at, job_id))
        by_finish = [j for _, j in sorted((at, j) for j, (_, at) in zip(jobs, finished, strict=True))]
        since = JobFilter(finished_after=t / 1000)
        assert _ids(client, since, oldest_first=True) == by_finish
        assert _ids(client, since) == by_finish[::-1]
        assert _ids(client, JobFilter(finished_after=t / 1000, types=("done.t0",)), oldest_first=True) == [
            j for j in by_finish if jobs.index(j) % 2 == 0
        ]
        assert _ids(client, JobFilter(finished_after=t / 1000, statuses=("succeeded",))) == [
            j for j in by_finish[::-1] if finished[jobs.index(j)][0] == "succeeded"
        ]
        until = JobFilter(finished_after=t / 1000, finished_before=(t + 20) / 1000)
        assert _ids(client, until, oldest_first=True) == [
            j for j in by_finish if finished[jobs.index(j)][1] < t + 20
        ]
        # A cursor holds the finish time; one of an id-ordered search of the same types is refused.
        page = client.list_jobs(since, limit=2)
        other = client.list_jobs(JobFilter(types=("done.t0",)), limit=2)
        assert _code(lambda: client.list_jobs(since, limit=2, cursor=other.next_cursor))[0] == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert [j.id for j in client.list_jobs(since, limit=2, cursor=page.next_cursor).jobs] == by_finish[
            ::-1
        ][2:4]


def test_cursors_page_bounds_and_bad_filters_are_refused_naming_the_field(dispatcher):
    with Client(dispatcher.target) as client:
        for i in range(4):
            client.enqueue("cursor.t", {"i": i})
        page = client.list_jobs(limit=2)
        assert len(page.jobs) == 2 and page.next_cursor
        bad = {
            "another filter": lambda: client.list_jobs(JobFilter(types=("x",)), cursor=page.next_cursor),
            "other order": lambda: client.list_jobs(cursor=page.next_cursor, oldest_first=True),
            "altered": lambda: client.list_jobs(cursor=page.next_cursor[:-2] + "AA"),
            "garbage": lambda: client.list_jobs(cursor="!!not-base64!!"),
            "too long": lambda: client.list_jobs(cursor="A" * 5000),
        }
        for what, call in bad.items():
            code, details = _code(call)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("cursor"), (what, details)
        code, details = _code(lambda: client.list_jobs(limit=501))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("limit"), details
        assert len(client.list_jobs(limit=500).jobs) == 4
        refused = {
            "filter.types[0]": JobFilter(types=("bad type!",)),
            "filter.type_patterns[0]": JobFilter(types=("bad*pattern with space",)),
            "filter.types": JobFilter(types=tuple(f"t{i}" for i in range(51))),
            "filter.payload[0].path": JobFilter(payload={"a-b": 1}),
            "filter.payload[0].value_json": JobFilter(payload={"a": {"nested": 1}}),
            "filter.payload": JobFilter(payload={f"k{i}": i for i in range(5)}),
            "filter.error_contains": JobFilter(error_contains="x" * 201),
            "filter.created_before_ms": JobFilter(created_after=2000, created_before=1000),
        }
        for field, job_filter in refused.items():
            code, details = _code(lambda f=job_filter: client.list_jobs(f))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field), (field, details)
        code, details = _code(lambda: client.list_jobs(max_payload_bytes=70_000))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("max_payload_bytes")


def test_listed_jobs_show_redis_live_state_and_cut_large_fields(dispatcher, db_url, start_worker):
    with Client(dispatcher.target) as client:
        big = client.enqueue("sleep.live", {"sleep": 30, "pad": "x" * 5000})
        start_worker(dispatcher.target, types="sleep.live")
        wait_until(lambda: client.get_job(big).status == "leased", timeout=15, message="leased")
        # A row behind Redis (as a status write on its way leaves it): the list shows Redis's state.
        query(db_url, "UPDATE jobs SET status = 'ready', lease_until = NULL WHERE id = ?", (big,))
        [job] = client.list_jobs(JobFilter(types=("sleep.live",))).jobs
        assert job.status == "leased" and job.lease_until_ms > 0 and job.attempts == 1
        assert job.truncated and len(job.payload) == 1024
        [whole] = client.list_jobs(JobFilter(types=("sleep.live",)), max_payload_bytes=65536).jobs
        assert not whole.truncated and json.loads(whole.payload)["pad"] == "x" * 5000


def test_a_scoped_token_sees_only_its_types(start_dispatcher, redis_url, db_url):
    proc = start_dispatcher(redis_url, db_url, auth_tokens=TOKENS, security=ChannelSecurity(token=ADMIN))
    with Client(proc.target, token=ADMIN) as admin, Client(proc.target, token=BILLING) as billing:
        mine = [billing.enqueue("billing.charge", {"customer_id": 1}) for _ in range(2)]
        theirs = [admin.enqueue("email.send", {"customer_id": 1}) for _ in range(2)]
        assert set(_ids(billing)) == set(mine)
        assert set(_ids(billing, JobFilter(payload={"customer_id": 1}))) == set(mine)
        assert _ids(billing, JobFilter(types=("email.send",))) == []
        assert _ids(billing, JobFilter(types=("*",))) == sorted(mine, reverse=True)
        assert set(_ids(admin)) == set(mine + theirs)
        assert billing.list_jobs(with_total=True).total == 2
        # A bulk action is the admin's.
        code, _ = _code(lambda: billing.bulk_jobs("cancel", JobFilter(types=("billing.charge",))))
        assert code is grpc.StatusCode.PERMISSION_DENIED
        listed = ctl(proc.target, "jobs", "list", "--json", token=BILLING)
        assert listed.returncode == 0, listed.stderr
        assert {j["id"] for j in json.loads(listed.stdout)["jobs"]} == set(mine)


@pytest.mark.parametrize("order", ["newest", "oldest"])
def test_dispatcherctl_jobs_list_filters_pages_and_refuses_bad_input(dispatcher, order):
    with Client(dispatcher.target) as client:
        ids = [client.enqueue("cli.t", {"customer_id": i}, delay=60) for i in range(5)]
    extra = ["--oldest-first"] if order == "oldest" else []
    first = ctl(dispatcher.target, "jobs", "list", "--type", "cli.*", "--limit", "3", "--json", *extra)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    expected = sorted(ids, reverse=order == "newest")
    assert [j["id"] for j in data["jobs"]] == expected[:3] and data["next_cursor"]
    rest = ctl(
        dispatcher.target, "jobs", "list", "--type", "cli.*", "--after", data["next_cursor"], "--json", *extra
    )
    assert [j["id"] for j in json.loads(rest.stdout)["jobs"]] == expected[3:]
    one = ctl(dispatcher.target, "jobs", "list", "--payload", "customer_id=3", "--state", "delayed")
    assert one.returncode == 0 and ids[3] in one.stdout and ids[2] not in one.stdout, one.stdout
    for args, message in (
        (["--payload", "customer_id"], "--payload"),
        (["--state", "sleeping"], "--state"),
        (["--since", "yesterday-ish"], "--since"),
        (["--after", "nonsense"], "cursor"),
    ):
        bad = ctl(dispatcher.target, "jobs", "list", *args)
        assert bad.returncode != 0 and message in bad.stderr, (args, bad.stderr)

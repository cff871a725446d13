"""The dashboard's pure parts: rates and percentiles from counters, sealed sessions, input checks."""

from __future__ import annotations

import time

import pytest

from dispatcher.dashboard import operations as ops
from dispatcher.dashboard.rates import Window, percentile, rates, sample_of
from dispatcher.dashboard.sessions import Sealer, Session
from worker_sdk import StatsSnapshot, TypeCounters

BOUNDS = (0.01, 0.1, 1.0)


def snap(member: str, at: int, started: int, succeeded: int, latency: tuple[int, ...]) -> StatsSnapshot:
    return StatsSnapshot(
        queues=(), dispatcher_id=member, sampled_at_ms=at, started_at_ms=started,
        counters={"t": TypeCounters(enqueued=succeeded, started=succeeded, succeeded=succeeded)},
        latency_bounds_s=BOUNDS, latency_counts=latency,
    )  # fmt: skip


def test_rates_sum_the_members_and_skip_one_that_restarted():
    before = sample_of([snap("a", 1000, 1, 10, (0, 0, 0, 0)), snap("b", 1000, 1, 5, (0, 0, 0, 0))], 1000)
    after = sample_of([snap("a", 3000, 1, 30, (0, 0, 0, 0)), snap("b", 3000, 2, 1, (0, 0, 0, 0))], 3000)
    assert rates(before, after)["succeeded"] == 10.0  # a: 20 in 2 s; b restarted: left out
    assert rates(after, after)["succeeded"] == 0.0


def test_percentiles_interpolate_within_their_bucket_and_stop_at_the_last_bound():
    assert percentile(BOUNDS, [0, 0, 0, 0], 0.5) is None
    assert percentile(BOUNDS, [10, 10, 10, 10], 0.5) == pytest.approx(0.005)
    assert percentile(BOUNDS, [0, 10, 10, 10], 0.5) == pytest.approx(0.055)
    assert percentile(BOUNDS, [0, 0, 0, 10], 0.99) == 1.0  # all beyond the last bound


def test_the_window_reports_latency_over_its_span_and_rates_over_the_last_step():
    window = Window(span_ms=60_000)
    first = window.add(sample_of([snap("a", 0, 1, 0, (0, 0, 0, 0))], 0))
    assert first["latency_s"] == {"p50": None, "p95": None, "p99": None}
    window.add(sample_of([snap("a", 1000, 1, 4, (4, 4, 4, 4))], 1000))
    point = window.add(sample_of([snap("a", 2000, 1, 4, (4, 4, 4, 4))], 2000))
    assert point["rates"]["succeeded"] == 0.0  # nothing in the last second
    assert point["latency_s"]["p50"] == pytest.approx(0.005)  # the first second's starts still count
    later = window.add(sample_of([snap("a", 70_000, 1, 4, (4, 4, 4, 4))], 70_000))
    assert later["latency_s"]["p50"] is None  # they left the minute


def test_a_sealed_session_opens_only_unaltered_and_unexpired():
    sealer = Sealer("k" * 32)
    session = Session("secret-token-0123456789", "ops", "admin", ("billing.*",), time.time() + 60)
    cookie = sealer.seal(session)
    assert "secret-token" not in cookie
    assert sealer.open(cookie) == session
    assert sealer.open(cookie[:-4] + ("AAAA" if not cookie.endswith("AAAA") else "BBBB")) is None
    assert Sealer("x" * 32).open(cookie) is None
    assert sealer.open(sealer.seal(Session("t", "ops", "admin", (), time.time() - 1))) is None
    assert sealer.open("A" * 5000) is None and sealer.open(None) is None


def test_the_search_form_becomes_a_job_filter_and_bad_fields_are_named():
    f = ops.job_filter(
        {"type": "billing.*, email.send", "status": "dead", "payload": "customer_id = 42; region = eu",
         "created_after": "2026-12-05T10:00", "reason": "handler_error"}
    )  # fmt: skip
    assert f.types == ("billing.*", "email.send") and f.statuses == ("dead",)
    assert f.payload == {"customer_id": 42, "region": "eu"}
    assert f.created_after == 1796464800.0 and f.dead_reason == "handler_error"
    for inputs, message in [
        ({"status": "asleep"}, "status:"),
        ({"payload": "a = 1; b = 2; c = 3; d = 4; e = 5"}, "at most 4"),
        ({"payload": "= 1"}, "path = value"),
        ({"finished_before": "soon"}, "finished_before:"),
        ({"reason": "bored"}, "reason:"),
        ({"error": "x" * 1001}, "error: at most 1000"),
    ]:
        with pytest.raises(ops.BadInput, match=message):
            ops.job_filter(inputs)


def test_shown_bytes_pretty_prints_json_and_cuts_big_payloads():
    assert ops.shown_bytes(b'{"b":1,"a":[1,2]}')["text"] == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
    big = ops.shown_bytes(b"x" * (ops.MAX_SHOWN_BYTES + 10))
    assert (
        big["truncated"]
        and len(big["text"]) == ops.MAX_SHOWN_BYTES
        and big["size"] == ops.MAX_SHOWN_BYTES + 10
    )
    assert ops.shown_bytes(b"\xff\x00")["text"] == "ff 00"

"""The search filter and cursor, without a server: every bad field refused naming it, patterns and
scopes resolved to exact types, cursors bound to their filter and order, ids bounding time ranges."""

from __future__ import annotations

import pytest

from dispatcher.queue import job_filter
from dispatcher.queue.ids import time_of
from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

KNOWN = ["billing.charge", "billing.refund", "email.send", "report.build"]


def _resolve(f: pb.JobFilter, scope: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    from fnmatch import fnmatchcase

    search = job_filter.parse(f)
    return search.resolve(
        KNOWN, lambda t: not scope or any(fnmatchcase(t, p) for p in scope), bool(scope)
    ).types


def test_patterns_names_and_scopes_resolve_to_exact_types():
    assert _resolve(pb.JobFilter()) is None
    assert _resolve(pb.JobFilter(types=["email.send"])) == ("email.send",)
    assert _resolve(pb.JobFilter(type_patterns=["billing.*"])) == ("billing.charge", "billing.refund")
    both = pb.JobFilter(types=["report.build"], type_patterns=["billing.r*"])
    assert _resolve(both) == ("billing.refund", "report.build")  # any of them
    assert _resolve(pb.JobFilter(), scope=("billing.*",)) == ("billing.charge", "billing.refund")
    assert _resolve(pb.JobFilter(types=["email.send"]), scope=("billing.*",)) == ()
    # An idempotency key or a dead reason without a type has an index of its own (migration 0019).
    assert _resolve(pb.JobFilter(idempotency_key="k")) is None
    assert _resolve(pb.JobFilter(dead_reason=pb.DEAD_REASON_LEASE_EXPIRED)) is None


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.JobFilter(types=["has space"]), "filter.types[0]"),
        (pb.JobFilter(type_patterns=["a b*"]), "filter.type_patterns[0]"),
        (pb.JobFilter(statuses=[99]), "filter.statuses[0]"),
        (pb.JobFilter(priorities=[pb.PRIORITY_UNSPECIFIED]), "filter.priorities[0]"),
        (pb.JobFilter(created_after_ms=-1), "filter.created_after_ms"),
        (pb.JobFilter(finished_after_ms=5, finished_before_ms=5), "filter.finished_before_ms"),
        (pb.JobFilter(idempotency_key="k" * 201), "filter.idempotency_key"),
        (pb.JobFilter(error_contains="a\x00b"), "filter.error_contains"),
        (pb.JobFilter(payload=[pb.PayloadMatch(path="a..b", value_json="1")]), "filter.payload[0].path"),
        (pb.JobFilter(payload=[pb.PayloadMatch(path="a", value_json="[1]")]), "filter.payload[0].value_json"),
        (pb.JobFilter(payload=[pb.PayloadMatch(path="a", value_json="NaN")]), "filter.payload[0].value_json"),
        (pb.JobFilter(payload=[pb.PayloadMatch(path="a", value_json="{")]), "filter.payload[0].value_json"),
        (pb.JobFilter(dead_reason=77), "filter.dead_reason"),
    ],
)
def test_each_bad_field_is_refused_naming_it(message, field):
    with pytest.raises(InvalidArgument) as refused:
        job_filter.parse(message)
    assert str(refused.value).startswith(field)


def test_payload_values_keep_their_json_type():
    kinds = {
        text: job_filter.payload_condition(pb.PayloadMatch(path="payload.x.y", value_json=text), "p")
        for text in ("42", "4.5", '"42"', "true", "false", "null")
    }
    assert [c.kind for c in kinds.values()] == ["number", "number", "string", "true", "false", "null"]
    assert kinds['"42"'].path == ("x", "y") and kinds['"42"'].value == "42"


def test_time_ranges_become_id_bounds():
    query = job_filter.parse(pb.JobFilter(created_after_ms=1_000, created_before_ms=2_000)).query
    assert time_of(query.min_id) == 1_000 and time_of(query.max_id) == 2_000
    finished = job_filter.parse(pb.JobFilter(finished_before_ms=10_000_000)).query
    assert time_of(finished.max_id) == 10_000_000 + job_filter.CLOCK_MARGIN_MS


def test_a_cursor_is_bound_to_its_filter_order_and_id():
    search = job_filter.parse(pb.JobFilter(types=["email.send"]))
    digest = search.digest(True)
    cursor = job_filter.encode_cursor("01M93GQ7AYXDHY4K8WD9E2XK6B", digest, True)
    assert job_filter.decode_cursor(cursor, digest, True) == "01M93GQ7AYXDHY4K8WD9E2XK6B"
    other = job_filter.parse(pb.JobFilter(types=["report.build"])).digest(True)
    forged = job_filter.encode_cursor("01M93GQ7AYXDHY4K8WD9E2XK6C", other, True)
    for bad, newest in (
        (cursor, False),
        (forged, True),
        (cursor[:-3], True),
        ("%%%", True),
        ("A" * 300, True),
    ):
        with pytest.raises(InvalidArgument, match="^cursor"):
            job_filter.decode_cursor(bad, digest, newest)


def test_page_bounds():
    assert job_filter.page_size(0) == job_filter.DEFAULT_PAGE
    assert job_filter.page_size(500) == 500
    with pytest.raises(InvalidArgument, match="^limit"):
        job_filter.page_size(501)
    with pytest.raises(InvalidArgument, match="^max_payload_bytes"):
        job_filter.payload_bytes(65537)


def test_a_few_types_are_read_type_by_type_and_merged():
    query = job_filter.parse(pb.JobFilter(type_patterns=["billing.*"])).resolve(KNOWN, lambda t: True, False)
    sql, params = query.page("postgres", "id", 50, "", True)
    assert sql.count("UNION ALL") == 1 and params == ["billing.charge", 50, "billing.refund", 50, 50]
    single = job_filter.parse(pb.JobFilter(types=["email.send"])).resolve(KNOWN, lambda t: True, False)
    one, _ = single.page("sqlite", "id", 50, "X", False)
    assert "UNION" not in one and "id > ?" in one

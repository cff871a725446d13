from __future__ import annotations

import pytest

from dispatcher.config import Settings
from dispatcher.queue.states import Priority
from dispatcher.queue.validation import job_spec
from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

NOW = 1_800_000_000_000
S = Settings()


def test_defaults_are_filled_in():
    job = job_spec(pb.JobSpec(type="email.send"), "job", S, NOW)
    assert (job.priority, job.run_at_ms, job.max_attempts, job.lease_ttl_ms) == (
        Priority.DEFAULT,
        NOW,
        5,
        60_000,
    )


def test_delay_and_run_at():
    assert job_spec(pb.JobSpec(type="t", delay_ms=1500), "job", S, NOW).run_at_ms == NOW + 1500
    assert job_spec(pb.JobSpec(type="t", run_at_ms=NOW - 10), "job", S, NOW).run_at_ms == NOW - 10


@pytest.mark.parametrize(
    "spec, field",
    [
        (pb.JobSpec(type=""), "job.type"),
        (pb.JobSpec(type="x" * 201), "job.type"),
        (pb.JobSpec(type="has space"), "job.type"),
        (pb.JobSpec(type="t", priority=9), "job.priority"),
        (pb.JobSpec(type="t", max_attempts=0), "job.max_attempts"),
        (pb.JobSpec(type="t", lease_ttl_ms=10), "job.lease_ttl_ms"),
        (pb.JobSpec(type="t", delay_ms=-1), "job.delay_ms"),
        (pb.JobSpec(type="t", delay_ms=1, run_at_ms=NOW), "not both"),
        (pb.JobSpec(type="t", run_at_ms=0), "job.run_at_ms"),
        (pb.JobSpec(type="t", payload=b"x" * ((1 << 20) + 1)), "job.payload"),
        (pb.JobSpec(type="t", idempotency_key="k" * 201), "job.idempotency_key"),
    ],
)
def test_bad_fields_name_the_field(spec, field):
    with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
        job_spec(spec, "job", S, NOW)


def test_headers_are_kept_as_sorted_json():
    spec = pb.JobSpec(type="t", headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "b": "x"})
    job = job_spec(spec, "job", S, NOW)
    assert job.headers == '{"b":"x","traceparent":"00-' + "a" * 32 + "-" + "b" * 16 + '-01"}'
    assert job_spec(pb.JobSpec(type="t"), "job", S, NOW).headers is None


@pytest.mark.parametrize(
    "headers, message",
    [
        ({f"h{i}": "v" for i in range(17)}, "jobs[3].headers: 17 headers is over the limit of 16"),
        ({"": "v"}, "jobs[3].headers: '' is not a header name"),
        ({"has space": "v"}, "jobs[3].headers: 'has space' is not a header name"),
        ({"-lead": "v"}, "is not a header name"),
        ({"k" * 65: "v"}, "is not a header name"),
        ({"big": "v" * 1025}, "jobs[3].headers['big']: 1025 characters is over the limit of 1024"),
        ({"ctl": "a\nb"}, "jobs[3].headers['ctl']: must not contain control characters"),
        ({f"h{i}": "v" * 1000 for i in range(5)}, "jobs[3].headers: 5010 bytes is over the limit of 4096"),
    ],
)
def test_bad_headers_name_the_field(headers, message):
    with pytest.raises(InvalidArgument) as err:
        job_spec(pb.JobSpec(type="t", headers=headers), "jobs[3]", S, NOW)
    assert message in str(err.value)

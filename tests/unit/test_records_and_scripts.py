from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.ids import _encode, ids_from, new_job_id, time_of
from dispatcher.records import JobRecord
from dispatcher.scripting import SCRIPT_NAMES, script_source
from dispatcher.states import JobState, Priority


@given(
    st.text(min_size=1, max_size=50),
    st.sampled_from(list(Priority)),
    st.sampled_from(list(JobState)),
    st.integers(0, 2**52),
    st.integers(1, 1000),
    st.integers(0, 1000),
    st.text(max_size=20),
    st.booleans(),
)
def test_record_round_trips(job_type, prio, state, run_at, max_attempts, attempts, key, cancel):
    record = JobRecord(
        job_type,
        prio,
        state,
        run_at,
        run_at,
        max_attempts,
        1000,
        attempts=attempts,
        idempotency_key=key,
        cancel_requested=cancel,
        token="3:17" if attempts else "",
    )
    assert JobRecord.unpack(record.pack()) == record


def test_every_script_loads_with_its_includes_inlined():
    for name in SCRIPT_NAMES:
        source = script_source(name)
        assert "@include" not in source
        assert source.lstrip().startswith("--[[")  # the KEYS/ARGV/return-code header
    assert "local function set_state" in script_source("ack")
    assert "local function retry_or_dead" in script_source("retry")


def test_job_ids_are_unique_and_time_ordered():
    ids = [new_job_id() for _ in range(2000)]
    assert len(set(ids)) == 2000 and all(len(i) == 26 for i in ids)
    assert ids[0][:10] <= ids[-1][:10]


@given(st.integers(0, 2**48 - 1), st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=5))
def test_a_batch_of_ids_spells_each_ones_time_and_80_random_bits(millis: int, chunks: list[bytes]):
    """Each id of a batch is the ULID of its millisecond and of the low 5 bits of its 16 bytes."""
    ids = ids_from(millis, b"".join(chunks))
    for job_id, chunk in zip(ids, chunks, strict=True):
        bits = 0
        for byte in chunk:
            bits = bits << 5 | byte & 31
        assert job_id == _encode(millis << 80 | bits)
        assert time_of(job_id) == millis

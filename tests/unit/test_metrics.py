"""Batched histogram observations count exactly as one observe() per value does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from dispatcher.ops.metrics import LATENCY_BUCKETS, observe_many

# Bounds themselves are in the draws: a value on a bound belongs to that bound's bucket.
VALUES = st.lists(
    st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(min_value=0, max_value=1000, allow_nan=False)),
    max_size=200,
)


def _histogram() -> Histogram:
    return Histogram("h", "h", buckets=LATENCY_BUCKETS, registry=CollectorRegistry())


def _samples(histogram: Histogram) -> dict[str, float]:
    [family] = histogram.collect()
    return {f"{s.name}{sorted(s.labels.items())}": s.value for s in family.samples if s.name != "h_created"}


@given(VALUES)
def test_observe_many_matches_observe_per_value(values: list[float]) -> None:
    one_by_one, batched = _histogram(), _histogram()
    for value in values:
        one_by_one.observe(value)
    observe_many(batched, values)
    expected, got = _samples(one_by_one), _samples(batched)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value), name

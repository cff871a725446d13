from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import FairnessPolicy
from dispatcher.queue.fairness import FairPicker
from dispatcher.queue.states import Priority


@given(st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 20)), st.integers(1, 50))
def test_each_cycle_gives_every_class_exactly_its_weight(weights, cycles):
    picker = FairPicker(FairnessPolicy(weights=weights))
    picks = picker.picks(sum(weights) * cycles)
    counts = Counter(picks)
    assert [counts[p] for p in Priority] == [w * cycles for w in weights]


def test_picks_are_spread_not_bursty():
    picks = FairPicker(FairnessPolicy(weights=(6, 3, 1))).picks(10)
    assert picks.count(Priority.LOW) == 1
    # No class waits longer than the sum of the other weights.
    assert "".join(str(int(p)) for p in picks).find("000000") == -1


def test_strict_always_asks_for_high_first():
    assert set(FairPicker(FairnessPolicy(strict=True)).picks(20)) == {Priority.HIGH}


def test_state_carries_across_calls():
    picker = FairPicker(FairnessPolicy(weights=(1, 1, 1)))
    assert Counter(picker.picks(1) + picker.picks(1) + picker.picks(1)) == Counter(Priority)

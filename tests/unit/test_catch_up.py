"""The catch-up policies: which missed occurrences one tick materializes and which it skips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.schedules.catch_up import CatchUp, plan_tick
from dispatcher.schedules.cron import Cron

MINUTE = 60_000
NOW = 1_780_000_000_000 // MINUTE * MINUTE + 20_000  # 20 s past a minute
EVERY_MINUTE = Cron.parse("* * * * *")


def plan(policy: CatchUp, downtime_min: int, max_lag_min: int = 5, limit: int = 500):
    return plan_tick(
        EVERY_MINUTE,
        policy,
        max_lag_min * MINUTE,
        NOW - downtime_min * MINUTE,
        NOW,
        lookahead_ms=5_000,
        grace_ms=15_000,
        limit=limit,
    )


def test_all_runs_every_missed_occurrence_within_max_lag_and_skips_the_rest() -> None:
    p = plan(CatchUp.ALL, downtime_min=10)
    assert len(p.materialize) + len(p.skipped) == 10
    assert all(NOW - 5 * MINUTE <= at for at in p.materialize)
    assert len(p.materialize) == 5 and len(p.skipped) == 5
    assert p.cursor == max(p.materialize) and not p.behind


def test_latest_runs_only_the_most_recent_missed_one() -> None:
    p = plan(CatchUp.LATEST, downtime_min=10)
    assert p.materialize == (NOW - 20_000,)
    assert len(p.skipped) == 9


def test_none_runs_nothing_missed() -> None:
    p = plan(CatchUp.NONE, downtime_min=10)
    assert p.materialize == ()
    assert len(p.skipped) == 10


def test_an_occurrence_within_the_grace_is_on_time_under_every_policy() -> None:
    for policy in CatchUp:
        p = plan_tick(EVERY_MINUTE, policy, MINUTE, NOW - 30_000, NOW, 5_000, 25_000, 500)
        assert p.materialize == (NOW - 20_000,) and p.skipped == ()


def test_lookahead_materializes_coming_occurrences_early() -> None:
    every_second = Cron.parse("* * * * * *")
    p = plan_tick(every_second, CatchUp.NONE, MINUTE, NOW, NOW, 5_000, 15_000, 500)
    assert p.materialize == tuple(NOW + i * 1000 for i in range(1, 6))


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(list(CatchUp)),
    downtime_min=st.integers(0, 120),
    max_lag_min=st.integers(1, 60),
    limit=st.integers(2, 40),
)
def test_ticks_in_small_batches_decide_exactly_as_one_big_tick(
    policy: CatchUp, downtime_min: int, max_lag_min: int, limit: int
) -> None:
    """A long downtime is caught up over several bounded ticks; the result must not depend on the
    batch size: same occurrences run, same skipped, each exactly once."""
    whole = plan(policy, downtime_min, max_lag_min, limit=10_000)
    ran: list[int] = []
    skipped: list[int] = []
    cursor = NOW - downtime_min * MINUTE
    for _ in range(1000):
        p = plan_tick(EVERY_MINUTE, policy, max_lag_min * MINUTE, cursor, NOW, 5_000, 15_000, limit)
        ran += p.materialize
        skipped += p.skipped
        assert p.cursor >= cursor
        cursor = p.cursor
        if not p.behind:
            break
    assert sorted(ran) == sorted(whole.materialize)
    assert sorted(skipped) == sorted(whole.skipped)
    assert len(set(ran) | set(skipped)) == len(ran) + len(skipped)


@pytest.mark.parametrize("policy", list(CatchUp))
def test_nothing_missed_nothing_skipped(policy: CatchUp) -> None:
    p = plan(policy, downtime_min=0)
    assert p.skipped == ()

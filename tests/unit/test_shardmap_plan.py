"""shardmap.plan: balanced shard ownership with minimal moves, diffs, and rendezvous fallback owners."""

from __future__ import annotations

import binascii
import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardmap
from shardmap import Move, apply_moves, balanced_plan, diff, fallback_owner

# Plans of up to 512 shards: no per-example deadline (it would flake on slow CI machines).
relaxed = settings(deadline=None)

NAME = st.text(alphabet="abcdefghij0123456789-.", min_size=1, max_size=6)


@dataclass(frozen=True)
class Scenario:
    shard_count: int
    members: list[str]
    dead: list[str]
    current: dict[int, str | None]
    weights: dict[int, int] | None


@st.composite
def scenarios(draw: st.DrawFn, *, min_members: int = 1, max_shards: int = 512) -> Scenario:
    """Random shard count, member set, current owners (members, dead members, None, missing), weights."""
    shard_count = draw(st.integers(min_value=1, max_value=max_shards))
    names = draw(st.lists(NAME, min_size=min_members, max_size=16, unique=True))
    n_members = draw(st.integers(min_value=min_members, max_value=min(12, len(names))))
    members = names[:n_members]
    dead = names[n_members:]
    owners = st.one_of(st.none(), st.sampled_from(names))
    listed = draw(st.lists(owners, max_size=shard_count))
    current: dict[int, str | None] = dict(enumerate(listed))  # shards beyond the list are missing
    if draw(st.booleans()):
        current[shard_count + draw(st.integers(0, 3))] = members[0]  # out of range: ignored
    weights: dict[int, int] | None = None
    if draw(st.booleans()):
        big = draw(st.sampled_from([3, 100, 10**6]))
        weights = dict(enumerate(draw(st.lists(st.integers(0, big), max_size=shard_count))))
    members = draw(st.permutations(members))  # the caller's order must not matter
    return Scenario(shard_count, members, dead, current, weights)


def counts(plan: Mapping[int, str], members: Sequence[str]) -> Counter[str]:
    c: Counter[str] = Counter(dict.fromkeys(members, 0))
    c.update(plan.values())
    return c


def minimal_moves(shard_count: int, current: Mapping[int, str | None], members: Sequence[str]) -> int:
    """The least number of moves to a count-balanced assignment, computed from first principles.

    Every member ends with ``base`` or ``base + 1`` shards, ``extra`` of them with ``base + 1``. A
    member can keep at most ``min(held, its final count)`` of its shards, and giving the ``+1`` to a
    member keeps one more shard only if it holds more than ``base``. Everything not kept moves.
    """
    held = Counter(current.get(s) for s in range(shard_count) if current.get(s) in set(members))
    base, extra = divmod(shard_count, len(members))
    kept = sum(min(held[m], base) for m in members)
    kept += min(extra, sum(1 for m in members if held[m] > base))
    return shard_count - kept


def member_weights(plan: Mapping[int, str], members: Sequence[str], weights: Mapping[int, int]) -> dict:
    total = dict.fromkeys(members, 0)
    for shard, m in plan.items():
        total[m] += weights.get(shard, 0)
    return total


def balanced_map(shard_count: int, members: Sequence[str], order: Sequence[int]) -> dict[int, str]:
    """A count-balanced map: member i % n at position i, shuffled by ``order``."""
    ms = sorted(members)
    return {shard: ms[i % len(ms)] for i, shard in enumerate(order)}


# -- structure ----------------------------------------------------------------------------------


def test_reexported() -> None:
    for name in ("Move", "apply_moves", "balanced_plan", "diff", "fallback_owner"):
        assert name in shardmap.__all__
        assert getattr(shardmap, name) is getattr(shardmap.plan, name)


def test_move_is_frozen() -> None:
    move = Move(shard=3, source=None, target="a", weight=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        move.target = "b"  # type: ignore[misc]


@relaxed
@given(scenarios())
def test_every_shard_has_one_member_owner(sc: Scenario) -> None:
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    assert sorted(plan) == list(range(sc.shard_count))
    assert set(plan.values()) <= set(sc.members)


@relaxed
@given(scenarios())
def test_counts_balanced_within_one(sc: Scenario) -> None:
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    c = counts(plan, sc.members)
    assert max(c.values()) - min(c.values()) <= 1
    assert sum(c.values()) == sc.shard_count


@relaxed
@given(scenarios())
def test_diff_then_apply_moves_gives_the_plan(sc: Scenario) -> None:
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    old = {s: o for s, o in sc.current.items() if s < sc.shard_count}
    moves = diff(old, plan, sc.weights)
    assert [m.shard for m in moves] == sorted({m.shard for m in moves})
    for m in moves:
        assert m.source == old.get(m.shard) != m.target
        assert m.weight == (sc.weights or {}).get(m.shard, 0)
    assert apply_moves(old, moves) == plan
    assert diff(plan, plan) == []


@relaxed
@given(scenarios())
def test_number_of_moves_is_minimal(sc: Scenario) -> None:
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    moves = diff(sc.current, plan)
    assert len(moves) == minimal_moves(sc.shard_count, sc.current, sc.members)
    # Only orphans and shards of members above their final count move.
    final = counts(plan, sc.members)
    for m in moves:
        if m.source in sc.members:
            held = sum(1 for s in range(sc.shard_count) if sc.current.get(s) == m.source)
            assert held > final[m.source]
        # A receiver never loses a shard it had: targets end with more shards than they held.
        assert sum(1 for s in range(sc.shard_count) if sc.current.get(s) == m.target) < final[m.target]


@relaxed
@given(scenarios())
def test_plan_of_a_plan_moves_nothing(sc: Scenario) -> None:
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    assert balanced_plan(sc.shard_count, plan, sc.members, sc.weights) == plan
    assert balanced_plan(sc.shard_count, plan, sc.members) == plan


@relaxed
@given(st.data())
def test_any_balanced_map_is_kept(data: st.DataObject) -> None:
    sc = data.draw(scenarios())
    order = data.draw(st.permutations(range(sc.shard_count)))
    old = balanced_map(sc.shard_count, sc.members, order)
    assert balanced_plan(sc.shard_count, old, sc.members, sc.weights) == old


@relaxed
@given(scenarios(), NAME)
def test_adding_a_member_moves_only_its_share(sc: Scenario, newcomer: str) -> None:
    if newcomer in sc.members:
        return
    n = len(sc.members)
    before = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    after = balanced_plan(sc.shard_count, before, [*sc.members, newcomer], sc.weights)
    moves = diff(before, after)
    assert {m.target for m in moves} <= {newcomer}
    assert len(moves) == counts(after, [newcomer])[newcomer]
    assert len(moves) in (sc.shard_count // (n + 1), -(-sc.shard_count // (n + 1)))
    assert len(moves) == minimal_moves(sc.shard_count, before, [*sc.members, newcomer])


@relaxed
@given(scenarios(min_members=2), st.data())
def test_removing_a_member_moves_only_its_shards(sc: Scenario, data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(sc.members))
    rest = [m for m in sc.members if m != gone]
    before = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    after = balanced_plan(sc.shard_count, before, rest, sc.weights)
    moves = diff(before, after)
    assert {m.shard for m in moves} == {s for s, o in before.items() if o == gone}
    assert all(m.source == gone and m.target in rest for m in moves)


# -- weights ----------------------------------------------------------------------------------


@relaxed
@given(scenarios(), st.lists(st.integers(0, 10**6), max_size=512))
def test_all_orphans_not_worse_than_round_robin(sc: Scenario, listed: list[int]) -> None:
    weights = dict(enumerate(listed[: sc.shard_count]))
    plan = balanced_plan(sc.shard_count, {}, sc.members, weights)
    ms = sorted(sc.members)
    round_robin = {s: ms[s % len(ms)] for s in range(sc.shard_count)}
    assert balanced_plan(sc.shard_count, {}, sc.members) == round_robin
    best = max(member_weights(plan, ms, weights).values())
    assert best <= max(member_weights(round_robin, ms, weights).values())


@relaxed
@given(scenarios(), st.lists(st.integers(0, 10**6), max_size=512))
def test_weights_never_worse_than_ignoring_them(sc: Scenario, listed: list[int]) -> None:
    weights = dict(enumerate(listed[: sc.shard_count]))
    weighted = balanced_plan(sc.shard_count, sc.current, sc.members, weights)
    plain = balanced_plan(sc.shard_count, sc.current, sc.members)
    assert len(diff(sc.current, weighted)) == len(diff(sc.current, plain))
    assert max(member_weights(weighted, sc.members, weights).values()) <= max(
        member_weights(plain, sc.members, weights).values()
    )


@relaxed
@given(scenarios())
def test_zero_weights_same_as_none(sc: Scenario) -> None:
    zeros = dict.fromkeys(range(sc.shard_count), 0)
    assert balanced_plan(sc.shard_count, sc.current, sc.members, zeros) == balanced_plan(
        sc.shard_count, sc.current, sc.members
    )


@relaxed
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic(sc: Scenario, rnd) -> None:  # type: ignore[no-untyped-def]
    plan = balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights)
    assert balanced_plan(sc.shard_count, sc.current, sc.members, sc.weights) == plan
    # Neither member order nor mapping insertion order matters.
    members = list(sc.members)
    rnd.shuffle(members)
    current_items = list(sc.current.items())
    rnd.shuffle(current_items)
    weights = None
    if sc.weights is not None:
        weight_items = list(sc.weights.items())
        rnd.shuffle(weight_items)
        weights = dict(weight_items)
    assert balanced_plan(sc.shard_count, dict(current_items), tuple(members), weights) == plan


def test_weighted_example() -> None:
    weights = {0: 8, 1: 1, 2: 8, 3: 1}
    assert balanced_plan(4, {}, ["b", "a"]) == {0: "a", 1: "b", 2: "a", 3: "b"}
    plan = balanced_plan(4, {}, ["b", "a"], weights)
    assert member_weights(plan, ["a", "b"], weights) == {"a": 9, "b": 9}


def test_heavy_orphan_goes_to_lightest_member() -> None:
    # Each member keeps its shard and receives one orphan; the heaviest orphan joins the lightest b.
    current: dict[int, str | None] = {0: "a", 1: "b", 2: "c", 3: None, 4: "dead"}
    weights = {0: 50, 1: 1, 2: 20, 3: 90, 4: 5, 5: 3}
    plan = balanced_plan(6, current, ["c", "b", "a"], weights)
    assert [plan[s] for s in range(3)] == ["a", "b", "c"]
    assert plan[3] == "b"
    assert member_weights(plan, ["a", "b", "c"], weights) == {"a": 53, "b": 91, "c": 25}


def test_overloaded_member_sheds_to_even_out() -> None:
    # a holds everything; it keeps 2 of 4 shards. The even split is 10 + 10.
    current: dict[int, str | None] = dict.fromkeys(range(4), "a")
    weights = {0: 9, 1: 1, 2: 9, 3: 1}
    plan = balanced_plan(4, current, ["a", "b"], weights)
    assert len(diff(current, plan)) == 2
    assert member_weights(plan, ["a", "b"], weights) == {"a": 10, "b": 10}


# -- fallback_owner -------------------------------------------------------------------------------


@relaxed
@given(st.lists(NAME, min_size=1, max_size=12, unique=True), st.integers(0, 16383))
def test_fallback_owner_is_the_rendezvous_winner(members: list[str], shard: int) -> None:
    owner = fallback_owner(shard, members)
    assert owner in members
    assert fallback_owner(shard, list(reversed(members))) == owner
    top = max(binascii.crc32(f"{m}:{shard}".encode()) for m in members)
    assert owner == min(m for m in members if binascii.crc32(f"{m}:{shard}".encode()) == top)


@relaxed
@given(st.lists(NAME, min_size=2, max_size=12, unique=True), st.data())
def test_removing_a_member_only_moves_its_fallbacks(members: list[str], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    for shard in range(512):
        before = fallback_owner(shard, members)
        after = fallback_owner(shard, rest)
        if before != gone:
            assert after == before
        else:
            assert after in rest


def test_fallback_owner_known_value() -> None:
    members = ["d1", "d2", "d3"]
    scores = {m: binascii.crc32(f"{m}:7".encode()) for m in members}
    assert fallback_owner(7, members) == max(members, key=scores.__getitem__)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shard_count", "members", "match"),
    [
        (4, [], "empty"),
        (4, ["a", "a"], "duplicate"),
        (4, ["a", ""], "non-empty"),
        (0, ["a"], "shard_count"),
        (-3, ["a"], "shard_count"),
    ],
)
def test_balanced_plan_rejects_bad_input(shard_count: int, members: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        balanced_plan(shard_count, {}, members)


@pytest.mark.parametrize("members", [[], ["a", "a"], [""]])
def test_fallback_owner_rejects_bad_members(members: list[str]) -> None:
    with pytest.raises(ValueError):
        fallback_owner(0, members)


def test_apply_moves_checks_sources() -> None:
    old: dict[int, str | None] = {0: "a", 1: None}
    assert apply_moves(old, [Move(0, "a", "b", 1), Move(1, None, "a", 0), Move(2, None, "c", 0)]) == {
        0: "b",
        1: "a",
        2: "c",
    }
    assert old == {0: "a", 1: None}
    with pytest.raises(ValueError, match="shard 0"):
        apply_moves(old, [Move(0, "b", "c", 0)])
    with pytest.raises(ValueError, match="shard 5"):
        apply_moves(old, [Move(5, "a", "c", 0)])
    # Moves apply in order, so a chain on one shard is fine.
    assert apply_moves(old, [Move(0, "a", "b"), Move(0, "b", "c")]) == {0: "c", 1: None}

"""Shard ownership planning: who owns which logical shard. Pure, deterministic, no I/O.

An *assignment* maps every shard ``0..S-1`` to the member (dispatcher name) that owns it. When the
member set changes, :func:`balanced_plan` computes a new assignment that is balanced by count and moves
as few shards as possible; :func:`diff` turns two assignments into a list of :class:`Move` and
:func:`apply_moves` replays such a list. :func:`fallback_owner` answers "who serves this shard while
its assigned owner is dead" identically in every process, without coordination.

Rules of :func:`balanced_plan`, with ``n`` members and ``S`` shards:

* **Quotas.** Every member owns ``S // n`` shards, and ``S % n`` members own one more. The members
  that get the extra shard are those currently holding the most shards (ties: by member name), which
  is the choice that keeps the most shards in place.
* **Orphans.** A shard is an orphan when its current owner is ``None``, is missing, or is not a
  member. Every orphan moves.
* **Minimal moves.** A shard whose current owner is a member stays there unless that member holds
  more than its quota; such a member keeps exactly ``quota`` of its shards and releases the rest. So
  the number of moves is exactly ``sum(max(0, held - quota)) + orphans``, which is the least possible.
* **Receivers.** Released shards and orphans go to the members below their quota, to fill each up to
  exactly its quota. Without weights a donor keeps its lowest-numbered shards, and the pool is dealt
  in shard order to the receiver with the fewest shards (ties: by name), so an all-orphan map is
  dealt round-robin by shard number over the sorted members.
* **Weights.** Among the plans allowed by the rules above (same quotas, same moved count) weights
  choose which shards a donor keeps and which receiver gets which shard, to even out the summed
  weight per member: heavy shards go first to the lightest receiver, a donor keeps the run of its
  shards whose weight is closest to the mean per member (so a heavy donor sheds heavy shards and a
  light one sheds light shards), and then pairwise swaps that narrow the gap between two members are
  applied. The result is never worse, in the heaviest member's summed weight, than the plan computed
  without weights. Shards missing from ``weights`` weigh 0.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Move", "apply_moves", "balanced_plan", "diff", "fallback_owner"]


@dataclass(frozen=True)
class Move:
    """Shard ``shard`` changes owner from ``source`` (``None``: no live owner) to ``target``.

    ``weight`` is informational (for example the shard's pending jobs), for display and balancing.
    """

    shard: int
    source: str | None
    target: str
    weight: int = 0


def _check_members(members: Sequence[str]) -> list[str]:
    if isinstance(members, str):
        raise TypeError("members must be a sequence of names, not a string")
    names = list(members)
    if not names:
        raise ValueError("members must not be empty")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"member names must be non-empty strings, got {name!r}")
    if len(set(names)) != len(names):
        dupes = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"duplicate members: {dupes}")
    return sorted(names)


def _quotas(shard_count: int, held: Mapping[str, int], members: Sequence[str]) -> dict[str, int]:
    """Per-member shard quotas: ``S // n`` each, plus one for the ``S % n`` members holding the most
    shards in ``held`` (ties by name). ``members`` must be sorted and valid."""
    base, extra = divmod(shard_count, len(members))
    by_held = sorted(members, key=lambda m: (-held.get(m, 0), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(by_held)}


def balanced_plan(
    shard_count: int,
    current: Mapping[int, str | None],
    members: Sequence[str],
    weights: Mapping[int, int] | None = None,
) -> dict[int, str]:
    """A new assignment ``shard -> member`` for shards ``0..shard_count-1``.

    Every shard gets exactly one owner among ``members``; owners differ by at most one in shard count;
    and as few shards as possible move: the quotas are ``shard_count // n`` plus one for the
    ``shard_count % n`` members currently holding the most shards (ties by name), a shard keeps its
    current owner when that owner is a member and is not above its quota, so exactly
    ``sum(max(0, held - quota)) + orphans`` shards move. Orphans (owner ``None``, missing, or not a
    member) and shards released by members above quota go to the members below quota, fewest shards
    first. Keys of ``current`` outside ``0..shard_count-1`` are ignored.

    With ``weights`` (shard -> weight, missing shards weigh 0), among the equally valid choices the
    plan evens out the summed weight per member (heavy shards to the lightest members, then swaps that
    narrow gaps) without changing the count balance or the number of moves; its heaviest member is
    never heavier than in the plan without weights. An already balanced map with the same members is
    returned unchanged. Deterministic: members are sorted and ties are broken by member name and
    shard number.

    Raises ValueError when ``members`` is empty, contains duplicates or empty strings, or
    ``shard_count < 1``.
    """
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    names = _check_members(members)
    member_set = set(names)

    owned: dict[str, list[int]] = {m: [] for m in names}
    orphans: list[int] = []
    for shard in range(shard_count):
        owner = current.get(shard)
        if owner is not None and owner in member_set:
            owned[owner].append(shard)
        else:
            orphans.append(shard)
    quota = _quotas(shard_count, {m: len(s) for m, s in owned.items()}, names)

    plain = _plan_by_count(owned, orphans, quota, names)
    if weights is None:
        return plain
    w = {shard: weights.get(shard, 0) for shard in range(shard_count)}
    candidates = [plain, _plan_by_weight(owned, orphans, quota, names, w)]
    refined = [_refine(c, owned, quota, names, w) for c in candidates]
    # Ties go to the first candidate, so all-zero weights give the same plan as no weights.
    return min(refined, key=lambda plan: _spread(plan, names, w))


def _plan_by_count(
    owned: Mapping[str, list[int]], orphans: list[int], quota: Mapping[str, int], names: list[str]
) -> dict[int, str]:
    """Donors keep their lowest-numbered shards; the pool is dealt in shard order, fewest shards first."""
    plan: dict[int, str] = {}
    pool = list(orphans)
    for m in names:
        for i, shard in enumerate(owned[m]):  # ascending shard order
            if i < quota[m]:
                plan[shard] = m
            else:
                pool.append(shard)
    count = {m: min(len(owned[m]), quota[m]) for m in names}
    for shard in sorted(pool):
        target = min((m for m in names if count[m] < quota[m]), key=lambda m: (count[m], m))
        plan[shard] = target
        count[target] += 1
    return plan


def _plan_by_weight(
    owned: Mapping[str, list[int]],
    orphans: list[int],
    quota: Mapping[str, int],
    names: list[str],
    w: Mapping[int, int],
) -> dict[int, str]:
    """Donors keep the run of shards (in weight order) closest to the mean weight per member; the pool
    goes heaviest first to the lightest receiver with room left."""
    mean = sum(w.values()) / len(names)
    plan: dict[int, str] = {}
    pool = list(orphans)
    total = dict.fromkeys(names, 0)
    count = dict.fromkeys(names, 0)
    for m in names:
        shards = owned[m]
        keep = quota[m]
        if len(shards) <= keep:
            kept = list(shards)
        else:
            by_weight = sorted(shards, key=lambda s: (w[s], s))
            sums = [0]
            for s in by_weight:
                sums.append(sums[-1] + w[s])
            windows = range(len(shards) - keep + 1)
            start = min(windows, key=lambda i: (abs(sums[i + keep] - sums[i] - mean), i))
            kept = by_weight[start : start + keep]
            pool.extend(by_weight[:start] + by_weight[start + keep :])
        for s in kept:
            plan[s] = m
            total[m] += w[s]
        count[m] = len(kept)
    for shard in sorted(pool, key=lambda s: (-w[s], s)):
        target = min((m for m in names if count[m] < quota[m]), key=lambda m: (total[m], count[m], m))
        plan[shard] = target
        count[target] += 1
        total[target] += w[shard]
    return plan


def _spread(plan: Mapping[int, str], names: list[str], w: Mapping[int, int]) -> tuple[int, int]:
    """(heaviest member's summed weight, sum of squared member weights): lower is more even."""
    total = dict.fromkeys(names, 0)
    for shard, m in plan.items():
        total[m] += w[shard]
    return max(total.values()), sum(t * t for t in total.values())


def _refine(
    plan: dict[int, str],
    owned: Mapping[str, list[int]],
    quota: Mapping[str, int],
    names: list[str],
    w: Mapping[int, int],
) -> dict[int, str]:
    """Swap pairs of shards between two members while that narrows their weight gap.

    Only swaps that keep every count and the number of moves are allowed: a member at its quota never
    takes part; two receivers may exchange any shards they receive; a donor may take back one of its
    released shards from a receiver in exchange for one it kept. Each swap strictly lowers the sum of
    squared member weights and never raises the maximum, so the loop terminates and the plan only
    improves.
    """
    plan = dict(plan)
    source = {s: m for m in names for s in owned[m]}
    donors = {m for m in names if len(owned[m]) > quota[m]}
    receivers = {m for m in names if len(owned[m]) < quota[m]}
    # Shards that may change hands: everything a donor owned and everything a receiver gets.
    flex: dict[str, set[int]] = {m: set() for m in names}
    for shard, m in plan.items():
        if m in donors or (m in receivers and source.get(shard) != m):
            flex[m].add(shard)
    total = dict.fromkeys(names, 0)
    for shard, m in plan.items():
        total[m] += w[shard]
    active = sorted(donors | receivers)

    def may_hold(shard: int, member: str) -> bool:
        return member in receivers or source.get(shard) == member

    for _ in range(16 * len(plan) + 16):
        best: tuple[int, int, int, str, str] | None = None  # (badness, a, b, heavy, light)
        order = sorted(active, key=lambda m: (-total[m], m))
        for i, heavy in enumerate(order):
            for light in reversed(order[i + 1 :]):
                gap = total[heavy] - total[light]
                if gap <= 1:
                    continue
                give = sorted((w[a], a) for a in flex[heavy] if may_hold(a, light))
                take = sorted((w[b], b) for b in flex[light] if may_hold(b, heavy))
                if not give or not take:
                    continue
                take_w = [x for x, _ in take]
                for wa, a in give:
                    # Want wb close to wa - gap / 2, with 0 < wa - wb < gap.
                    j = bisect.bisect_left(take_w, wa - gap / 2)
                    for k in (j - 1, j):
                        if 0 <= k < len(take):
                            wb, b = take[k]
                            d = wa - wb
                            if 0 < d < gap:
                                cand = (abs(2 * d - gap), a, b, heavy, light)
                                if best is None or cand < best:
                                    best = cand
                if best is not None:
                    break
            if best is not None:
                break
        if best is None:
            break
        _, a, b, heavy, light = best
        plan[a], plan[b] = light, heavy
        flex[heavy].remove(a)
        flex[light].remove(b)
        flex[light].add(a)
        flex[heavy].add(b)
        total[heavy] += w[b] - w[a]
        total[light] += w[a] - w[b]
    return plan


def diff(
    old: Mapping[int, str | None], new: Mapping[int, str], weights: Mapping[int, int] | None = None
) -> list[Move]:
    """The moves that turn ``old`` into ``new``, sorted by shard.

    One :class:`Move` per shard of ``new`` whose owner differs from ``old`` (a shard missing from
    ``old`` has source ``None``); ``weight`` is ``weights[shard]``, or 0. Shards present only in
    ``old`` are not reported (a move always has a target).
    """
    w = weights or {}
    return [
        Move(shard=shard, source=old.get(shard), target=new[shard], weight=w.get(shard, 0))
        for shard in sorted(new)
        if old.get(shard) != new[shard]
    ]


def apply_moves(old: Mapping[int, str | None], moves: Iterable[Move]) -> dict[int, str | None]:
    """A copy of ``old`` with each move applied in order.

    Raises ValueError if a move's ``source`` is not the shard's owner at that point (a missing shard
    counts as owner ``None``). ``old`` is not modified.
    """
    result: dict[int, str | None] = dict(old)
    for move in moves:
        owner = result.get(move.shard)
        if owner != move.source:
            raise ValueError(f"move of shard {move.shard} expects owner {move.source!r}, found {owner!r}")
        result[move.shard] = move.target
    return result


def fallback_owner(shard: int, members: Sequence[str]) -> str:
    """The member that serves ``shard`` while its assigned owner is dead.

    Rendezvous (highest-random-weight) hashing: each member scores ``zlib.crc32(f"{member}:{shard}")``
    (UTF-8) and the highest score wins, ties going to the smaller name. The hash is stable across
    processes, so every process computes the same answer; and removing a member only changes the
    answer for the shards that member won. Raises ValueError for an invalid member list (as
    :func:`balanced_plan`).
    """
    names = _check_members(members)
    return min(names, key=lambda m: (-zlib.crc32(f"{m}:{shard}".encode()), m))

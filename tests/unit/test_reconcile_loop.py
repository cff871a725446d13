"""ReconcileLoop's bookkeeping: a loss Redis suffered is handed to the reconciler when it is seen."""

from __future__ import annotations

from typing import Any, cast

from dispatcher.queue.ownership import Ownership
from dispatcher.queue.reconcile_loop import ReconcileLoop
from dispatcher.queue.reconciler import Reconciler
from shardq_common.clock import wall_ms


def loop_of(reconciler: Reconciler) -> ReconcileLoop:
    """A loop of a process that owns no shard: what it asks for is noted, and no reconcile runs."""
    unused = cast(Any, None)  # neither the reconciles nor the ownership changes reach the stores here
    ownership = Ownership("d1", unused, unused, 10_000, on_acquired=unused, on_lost=unused)
    return ReconcileLoop(reconciler, ownership, interval_s=60)


async def test_a_loss_is_noted_when_it_is_seen_and_only_then() -> None:
    reconciler = Reconciler(cast(Any, None), cast(Any, None), cast(Any, None))
    loop = loop_of(reconciler)
    loop.soon(3)
    assert reconciler.lost_at(3) == 0  # a reconcile asked for without a loss
    before = wall_ms()
    loop.soon(3, after_loss=True)
    assert before <= reconciler.lost_at(3) <= wall_ms()
    seen = reconciler.lost_at(3)
    loop.soon(3)
    loop.soon_owned([3, 4], after_loss=True)  # shards this process does not own are not its to note
    assert (reconciler.lost_at(3), reconciler.lost_at(4)) == (seen, 0)
    for task in loop.tasks():
        await task

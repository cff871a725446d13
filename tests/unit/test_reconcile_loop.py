"""ReconcileLoop's bookkeeping of when Redis was found to have lost a shard's data: after a loss the
reconciler restores every missing job at once, and reports as lost those stamped before that time
(tests/integration/test_reconciler.py shows the restore against a real Redis and store). Here the
reconciler only records what it is asked, and can be told to fail, so that the loop's retry is seen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from dispatcher.queue.reconcile_loop import ReconcileLoop
from shardq_common.clock import wall_ms
from tests.support.wait import wait_for

SHARD = 3


class RecordingReconciler:
    def __init__(self) -> None:
        self.calls: list[int | None] = []  # lost_at_ms of each reconcile, in order
        self.fail_next = False
        self.gate: asyncio.Event | None = None  # when set, a reconcile waits for it

    async def reconcile(
        self, shard: int, epoch: int, still_owner: Callable[[], bool], *, lost_at_ms: int | None = None
    ) -> int:
        self.calls.append(lost_at_ms)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the database went away")
        return 0


class Owning:
    """What the loop reads of Ownership: the epochs of the shards this process owns."""

    def __init__(self) -> None:
        self.epochs = {SHARD: 1}


def loop_with(reconciler: RecordingReconciler) -> ReconcileLoop:
    owning: Any = Owning()
    return ReconcileLoop(reconciler, owning, interval_s=3600)  # type: ignore[arg-type]


def next_wall_ms(after: int) -> int:
    """The wall clock's next millisecond after ``after``, spun for without yielding to the event loop
    (at most a millisecond)."""
    while (now := wall_ms()) <= after:
        pass
    return now


async def finished(loop: ReconcileLoop) -> None:
    await asyncio.gather(*loop.tasks())


async def test_a_loss_is_passed_on_with_when_it_was_noticed_and_a_plain_request_without() -> None:
    reconciler = RecordingReconciler()
    loop = loop_with(reconciler)
    before = wall_ms()
    loop.soon(SHARD, after_loss=True)
    after = wall_ms()
    await finished(loop)
    loop.soon(SHARD)
    await finished(loop)
    [lost_at, plain] = reconciler.calls
    assert lost_at is not None and before <= lost_at <= after
    assert plain is None


async def test_a_loss_noticed_twice_before_its_reconcile_starts_is_passed_on_with_the_later_time() -> None:
    """Jobs stamped between the two notices may have gone with the second loss: reported as lost."""
    reconciler = RecordingReconciler()
    loop = loop_with(reconciler)
    first_notice = wall_ms()
    loop.soon(SHARD, after_loss=True)  # its task has not started: nothing here yields to the loop
    second_notice = next_wall_ms(first_notice)
    loop.soon(SHARD, after_loss=True)
    await finished(loop)
    [lost_at] = reconciler.calls
    assert lost_at is not None and lost_at >= second_notice


async def test_a_loss_noticed_again_while_a_reconcile_runs_is_passed_to_the_next_with_its_own_time() -> None:
    """Jobs stamped between the two notices may have gone with the second loss: the reconcile after it
    must report them as lost, so it gets the second time, not the first."""
    reconciler = RecordingReconciler()
    reconciler.gate = asyncio.Event()
    loop = loop_with(reconciler)
    loop.soon(SHARD, after_loss=True)
    [first_notice] = await wait_for(lambda: reconciler.calls, message="the first reconcile never started")
    assert first_notice is not None
    second_notice = next_wall_ms(first_notice)
    loop.soon(SHARD, after_loss=True)  # kept for after the running one
    reconciler.gate.set()
    await finished(loop)
    runner = asyncio.create_task(loop.run())  # the loop's next round takes the kept request
    try:
        await wait_for(lambda: len(reconciler.calls) == 2, message="the kept request never ran")
    finally:
        runner.cancel()
    first, second = reconciler.calls
    assert first is not None and second is not None
    assert first < second_notice <= second


async def test_a_failed_reconcile_after_a_loss_is_tried_again_with_the_same_time() -> None:
    """Retried by the loop's next round: a retry given no loss time would make the jobs Redis lost
    wait for pushes that will never come (10 s each) and report them late."""
    reconciler = RecordingReconciler()
    reconciler.fail_next = True
    loop = loop_with(reconciler)
    loop.soon(SHARD, after_loss=True)
    await finished(loop)
    runner = asyncio.create_task(loop.run())
    try:
        await wait_for(lambda: len(reconciler.calls) == 2, message="the failed reconcile was not retried")
    finally:
        runner.cancel()
    first, retry = reconciler.calls
    assert first is not None and retry == first

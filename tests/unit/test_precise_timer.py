"""The precise timer: callbacks run in the loop's thread, in the order of their instants, never
before them; cancelled ones never run; an instant asked for later but due sooner is not held up
behind the one the timer thread is already waiting for."""

from __future__ import annotations

import asyncio
import threading

from shardq_common.clock import wall_ms_exact
from shardq_common.precise_timer import PreciseTimer
from shardq_common.wakeup import Wakeup


def test_callbacks_run_in_instant_order_never_early_and_not_when_cancelled() -> None:
    async def scenario() -> tuple[list[tuple[str, float, float]], set[int]]:
        timer = PreciseTimer()
        fired: list[tuple[str, float, float]] = []
        threads: set[int] = set()
        all_done = asyncio.Event()
        start = wall_ms_exact()

        def at(name: str, offset_ms: float) -> object:
            when = start + offset_ms

            def callback() -> None:
                fired.append((name, when, wall_ms_exact()))
                threads.add(threading.get_ident())
                if name == "last":
                    all_done.set()

            return timer.call_at(when, callback)

        at("late", 300)
        cancelled = at("cancelled", 100)
        at("last", 400)
        at("soon", 50)  # asked for after "late": the thread must wake for it sooner
        cancelled.cancel()  # type: ignore[attr-defined]
        at("past", -5)
        await asyncio.wait_for(all_done.wait(), timeout=10)
        return fired, threads

    fired, threads = asyncio.run(scenario())
    assert [name for name, _, _ in fired] == ["past", "soon", "late", "last"]
    assert all(ran >= when for _, when, ran in fired), fired
    assert threads == {threading.get_ident()}  # the loop's thread, not the timer's


def test_wakeup_wait_until_returns_at_the_instant_or_when_set() -> None:
    async def scenario() -> tuple[bool, float, float, bool]:
        wake = Wakeup()
        when = wall_ms_exact() + 30
        woken = await asyncio.wait_for(wake.wait_until(when), timeout=10)
        returned = wall_ms_exact()
        asyncio.get_running_loop().call_later(0.05, wake.set)
        set_early = await asyncio.wait_for(wake.wait_until(wall_ms_exact() + 60_000), timeout=10)
        return woken, when, returned, set_early

    woken, when, returned, set_early = asyncio.run(scenario())
    assert not woken and returned >= when
    assert set_early

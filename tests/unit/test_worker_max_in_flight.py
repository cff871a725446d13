"""``max_in_flight`` names handled types and positive caps; a bad one is refused when the worker is made."""

from __future__ import annotations

import pytest

from worker_sdk import JobContext, Worker


async def _noop(ctx: JobContext) -> None:
    return None


def test_a_cap_for_a_type_without_a_handler_is_refused():
    with pytest.raises(ValueError, match="'other', which has no handler"):
        Worker({"t": _noop}, max_in_flight={"other": 1}, handle_signals=False)


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match=r"max_in_flight\['t'\] must be at least 1"):
        Worker({"t": _noop}, max_in_flight={"t": 0}, handle_signals=False)


def test_caps_on_every_type_bound_the_leases_held():
    capped = Worker({"a": _noop, "b": _noop}, concurrency=100, max_in_flight={"a": 5, "b": 7})
    assert capped.concurrency == 12
    partly = Worker({"a": _noop, "b": _noop}, concurrency=100, max_in_flight={"a": 5})
    assert partly.concurrency == 100
    for worker in (capped, partly):
        worker._pool.shutdown(wait=False)

"""Fixtures of the integration tests: the state machines' redis-server of their module's own, and
a migrated store on the test's database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatcher.store import Store, open_store
from tests.support.state_machines import redis_port

__all__ = ["redis_port", "store"]


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """The store of ``db_url`` with every migration applied, closed after the test."""
    s = await open_store(db_url)
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()

"""What the stateful property tests over the real Lua scripts share: their hypothesis settings and a
redis-server of each test module's own."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.support.redis_server import RedisServer

# Shrinking a failing run of a machine takes minutes (every replay talks to Redis), longer than the
# suite's per-test timeout, so by default a failure is reported unshrunk: the full step list,
# replayable as printed (or from the example database). SHARDQ_TEST_SHRINK=1 shrinks it (slow).
_SHRINK = os.environ.get("SHARDQ_TEST_SHRINK", "").strip().lower() in ("1", "true", "yes")


def machine_settings(max_examples: int, steps: int) -> settings:
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=tuple(Phase) if _SHRINK else tuple(ph for ph in Phase if ph is not Phase.shrink),
        report_multiple_bugs=False,
        print_blob=True,
    )


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private redis-server (no persistence) for the module; yields its port."""
    server = RedisServer(tmp_path_factory.mktemp("state-machine-redis"))
    server.start()  # returns once it answers PING (10 s timeout)
    try:
        yield server.port
    finally:
        server.stop()

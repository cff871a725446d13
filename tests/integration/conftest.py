"""Fixtures of the integration tests: the state machines' redis-server of their module's own."""

from __future__ import annotations

from tests.support.state_machines import redis_port

__all__ = ["redis_port"]

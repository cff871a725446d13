"""Running it: metrics, the Redis connection and its faults, the embedded Redis."""

from __future__ import annotations

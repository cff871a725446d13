"""What the worker SDK and the dispatcher both need: the generated protocol code (pb), the
error classes and their gRPC status codes, channel security, the clocks, the wake-up primitive
and the log set-up. It imports neither dispatcher nor worker_sdk."""

from __future__ import annotations

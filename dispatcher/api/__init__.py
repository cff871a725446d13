"""The gRPC services (jobs, workers, schedules, shards), request validation, and the
authentication and TLS that guard them."""

from __future__ import annotations

"""The gRPC services (jobs, workers, schedules, shards), and the authentication and TLS that
guard them. The fields they receive are checked by queue/validation.py."""

from __future__ import annotations

"""Many dispatcher processes: the coordinator (which process owns which shard), peers
(hand-off), Redis master failover, and the supervisor that runs the processes of one host."""

from __future__ import annotations

"""Many dispatcher processes: the coordinator (which process owns which shard), the hand-off of
new jobs to a shard's owner (handoff, peers), Redis master failover, the cluster's queue state at
/metrics, and the supervisor that runs the processes of one host."""

from __future__ import annotations

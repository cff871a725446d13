"""Where a client (``Client`` or ``AsyncClient``) with ``route=True`` sends an enqueue: to the
dispatcher process that owns the job's shard.

Any dispatcher accepts any job. One that does not own the job type's shard commits the job and then
hands it to the owner over gRPC, which made a single enqueue about 2-3 ms slower on a 2-process
dispatcher (half the types are the other process's), and left one process doing every enqueue's
work. So the client reads the shard map (``GetShardMap``, as workers do) and sends each job straight
to its owner's advertised address. The map is re-read every ``MAP_REFRESH_S`` (``AsyncClient`` in
the background, ``Client`` in the one calling thread that finds it stale); a shard moved since is
still served (its old owner hands the job on). Until the map is known, when it cannot be read (an
old dispatcher, a token without the right), for shards without an owner, and for ``AVOID_S`` after
an owner could not be reached, jobs go to the client's target as before.

It is off by default because it trades availability for that latency: a call routed to an owner
that is frozen or partitioned away (its TCP connection up, nothing answering) waits out the call's
deadline and fails, since a call that may have arrived cannot be resent without risking a second
job; through the target, the job is committed and the failed hand-off only delays its queueing
(the shard is flagged for its owner to reconcile). Turn it on for clients that reach the
dispatchers' advertised addresses and prefer the latency.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import grpc

from shardmap import shard_for

from ._convert import ShardMap

MAP_REFRESH_S = 10.0
AVOID_S = 5.0


class OwnerRoutes:
    def __init__(self, target: str) -> None:
        self.target = target
        self._owner_of: dict[int, str] = {}
        self._shard_count = 0
        self._read_at = -float("inf")
        self._avoid_until: dict[str, float] = {}
        self._gone_since: dict[str, float] = {}  # owner address -> when a map first lacked it

    @property
    def known(self) -> bool:
        return self._read_at > -float("inf")

    def stale(self) -> bool:
        return time.monotonic() - self._read_at > MAP_REFRESH_S

    def update(self, view: ShardMap | None) -> None:
        """A map just read, or None when it could not be read (the target serves until the next try)."""
        self._read_at = time.monotonic()
        if view is not None:
            self._shard_count = view.shard_count
            self._owner_of = {s.shard: s.address for s in view.shards if s.address}

    def retired(self, held: Iterable[str], grace_s: float) -> list[str]:
        """Of the owner addresses the client holds channels to, those no map has named for
        ``grace_s`` (calls still in flight there have met their deadline by then): the client closes
        their channels. Dispatchers come back at new addresses (a pod's IP changes with every restart),
        so a long-lived client kept a channel per address it ever used."""
        now = time.monotonic()
        present = set(self._owner_of.values())
        gone = []
        for address in held:
            if address in present:
                self._gone_since.pop(address, None)
            elif now - self._gone_since.setdefault(address, now) >= grace_s:
                gone.append(address)
        for address in gone:
            del self._gone_since[address]
        self._avoid_until = {a: until for a, until in self._avoid_until.items() if until > now}
        return gone

    def address(self, job_type: str) -> str:
        if not self._shard_count:
            return self.target
        owner = self._owner_of.get(shard_for(job_type, self._shard_count), self.target)
        if owner != self.target and self._avoid_until.get(owner, 0.0) > time.monotonic():
            return self.target
        return owner

    def address_for(self, job_types: Iterable[str]) -> str:
        """Where jobs of these types go together: their one owner, else the target."""
        addresses = {self.address(t) for t in set(job_types)}
        return addresses.pop() if len(addresses) == 1 else self.target

    def failed(self, address: str, exc: Any) -> bool:
        """A call routed to ``address`` failed with ``exc`` (a blocking or asyncio call's error).
        An owner that is unavailable is avoided for a while and the map re-read. Returns whether to
        send the call to the target instead: only when it certainly never reached a dispatcher (no
        connection could be made), so that it cannot enqueue a job twice."""
        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
            return False
        self._avoid_until[address] = time.monotonic() + AVOID_S
        self._read_at = time.monotonic() - MAP_REFRESH_S
        return "failed to connect" in (exc.details() or "").lower()

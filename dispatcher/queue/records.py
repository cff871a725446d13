"""The job record kept in a shard's ``jobs`` hash, msgpack-encoded.

Short field names keep Redis memory per pending job small; the Lua scripts use
the same names (see scripts/includes/record.lua).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from .states import JobState, Priority


@dataclass(frozen=True)
class JobRecord:
    type: str  # t
    priority: Priority  # p
    state: JobState  # s
    run_at_ms: int  # r: run_at, or when the job became ready
    enqueued_at_ms: int  # e
    max_attempts: int  # m
    lease_ttl_ms: int  # l
    attempts: int = 0  # a: leases handed out
    failures: int = 0  # f: handler errors
    expirations: int = 0  # x: expired leases
    token: str = ""  # k
    deadline_ms: int = 0  # d
    idempotency_key: str = ""  # i
    cancel_requested: bool = False  # c
    dead_reason: str = ""  # z: why it is dead (for a new owner that finds it unrecorded in the DB)
    holder: str = ""  # o: the worker stream holding the lease (only its clean-up may shorten it)
    concurrency_key: str = ""  # g: the key its type's per-key limits and round robin go by ('' none)
    rate_limited: int = 0  # w: times its handler raised RateLimited (attempts not charged)
    # h: the job's headers (a msgpack map, absent when it has none), delivered with every lease. In the
    # record rather than beside it: every script that rewrites a record keeps it, a hand-off carries it.
    headers: Mapping[str, str] | None = None

    def pack(self, state: JobState | None = None) -> bytes:
        """msgpack of the record; ``state`` replaces its state (a new job's is decided when queued).
        Kept per state on the record: the jobs of one kind in an enqueue share one record (see
        ingest), so it is packed once for all of them, for the script call and for a hand-off."""
        packed: dict[JobState | None, bytes] = self.__dict__.setdefault("_packed", {})  # not a field
        raw = packed.get(state)
        if raw is None:
            raw = packed[state] = self._encode(state)
        return raw

    def _encode(self, state: JobState | None) -> bytes:
        data: dict[str, Any] = {
            "t": self.type,
            "p": int(self.priority),
            "s": str(state or self.state),
            "r": self.run_at_ms,
            "e": self.enqueued_at_ms,
            "m": self.max_attempts,
            "l": self.lease_ttl_ms,
            "a": self.attempts,
            "f": self.failures,
            "x": self.expirations,
        }
        if self.token:
            data["k"] = self.token
        if self.deadline_ms:
            data["d"] = self.deadline_ms
        if self.idempotency_key:
            data["i"] = self.idempotency_key
        if self.cancel_requested:
            data["c"] = 1
        if self.dead_reason:
            data["z"] = self.dead_reason
        if self.holder:
            data["o"] = self.holder
        if self.concurrency_key:
            data["g"] = self.concurrency_key
        if self.rate_limited:
            data["w"] = self.rate_limited
        if self.headers:
            data["h"] = dict(self.headers)
        return msgpack.packb(data)

    @classmethod
    def unpack(cls, raw: bytes) -> JobRecord:
        d = msgpack.unpackb(raw, raw=False)
        return cls(
            type=d["t"],
            priority=Priority(d["p"]),
            state=JobState(d["s"]),
            run_at_ms=int(d["r"]),
            enqueued_at_ms=int(d["e"]),
            max_attempts=int(d["m"]),
            lease_ttl_ms=int(d["l"]),
            attempts=int(d.get("a", 0)),
            failures=int(d.get("f", 0)),
            expirations=int(d.get("x", 0)),
            token=d.get("k", ""),
            deadline_ms=int(d.get("d", 0)),
            idempotency_key=d.get("i", ""),
            cancel_requested=bool(d.get("c", 0)),
            dead_reason=d.get("z", ""),
            holder=d.get("o", ""),
            concurrency_key=d.get("g", ""),
            rate_limited=int(d.get("w", 0)),
            headers=d.get("h") or None,
        )

"""Per-type settings of one job type: flow control (pause, concurrency and rate limits, concurrency
keys' limits and weights) and retention (how long its finished rows are kept).

Settings are data: kept in the DB (the ``queue_settings`` table), mirrored into the ``flow`` hash of
the type's shard (one msgpack map per type, see ``pack``), which the lease script reads at every call,
so a change takes effect at the next lease round and a limit holds across every dispatcher process.
docs/architecture.md ("Flow control") describes the Redis layout the scripts keep for it.

Retention is read from the DB by the shard owner's pruner (dispatcher/queue/pruner.py), never by a
script: it stays out of the packed map, which the lease script unpacks at every call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from shardq_common.errors import InvalidArgument

from .states import Priority

#: A concurrency key: a tenant, a customer, an account id. Bounded: it is part of Redis key names.
MAX_CONCURRENCY_KEY_LENGTH = 128
MAX_CONCURRENCY = 1_000_000
MAX_RATE_PER_S = 1_000_000.0
MIN_RATE_PER_S = 0.001  # one a quarter of an hour, or so: below that a rate is a typo for a pause
MAX_BURST = 1_000_000
MAX_WEIGHT = 1000
#: Named keys with their own limit or weight, per type: settings travel whole in one Redis field.
MAX_KEY_OVERRIDES = 1000
#: Bounds of a retention period: a minute (below that a finished row could outrun its status
#: write's trip to disk and the forget of its Redis record) to ten years.
MIN_RETENTION_S = 60
MAX_RETENTION_S = 10 * 366 * 86_400
ALL_CLASSES = frozenset(Priority)


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``per_s`` tokens a second, at most ``burst`` saved up (GCRA in the lease script)."""

    per_s: float
    burst: int = 1


@dataclass(frozen=True)
class QueueSettings:
    job_type: str
    #: Classes that lease nothing: every one of them pauses the type.
    paused: frozenset[Priority] = frozenset()
    #: Most jobs of the type leased at once, cluster-wide (0: no limit).
    concurrency: int = 0
    #: Most jobs of one concurrency key leased at once (0: no limit), and keys with their own limit.
    key_concurrency: int = 0
    key_concurrency_overrides: Mapping[str, int] = field(default_factory=dict)
    #: Share of leases between keys with ready jobs (default 1 each).
    key_weights: Mapping[str, int] = field(default_factory=dict)
    rate: Rate | None = None
    key_rate: Rate | None = None
    #: Seconds a succeeded or cancelled job's row is kept after it finished (0: the cluster's
    #: SHARDQ_RETENTION_SUCCEEDED).
    retain_finished_s: int = 0
    #: Seconds a dead-lettered job's row is kept (0: the cluster's SHARDQ_RETENTION_DEAD).
    retain_dead_s: int = 0

    @property
    def is_default(self) -> bool:
        return self == QueueSettings(self.job_type)

    @property
    def has_flow(self) -> bool:
        """Whether any flow control setting differs from the default (retention aside): only such
        types get a map in the Redis mirror."""
        return self.pack() != _DEFAULT_PACKED

    def pack(self) -> bytes:
        """The map the lease script reads: short names, only what is set."""
        out: dict[str, Any] = {}
        if self.paused:
            out["pause"] = sum(1 << int(c) for c in self.paused)
        if self.concurrency:
            out["n"] = self.concurrency
        if self.key_concurrency:
            out["kn"] = self.key_concurrency
        if self.key_concurrency_overrides:
            out["ko"] = dict(self.key_concurrency_overrides)
        if self.key_weights:
            out["kw"] = dict(self.key_weights)
        if self.rate:
            out["r"], out["b"] = self.rate.per_s, self.rate.burst
        if self.key_rate:
            out["kr"], out["kb"] = self.key_rate.per_s, self.key_rate.burst
        return msgpack.packb(out)

    @classmethod
    def unpack(cls, job_type: str, raw: bytes) -> QueueSettings:
        d = msgpack.unpackb(raw, raw=False)
        mask = int(d.get("pause", 0))
        return cls(
            job_type,
            paused=frozenset(c for c in Priority if mask & (1 << int(c))),
            concurrency=int(d.get("n", 0)),
            key_concurrency=int(d.get("kn", 0)),
            key_concurrency_overrides=dict(d.get("ko", {})),
            key_weights=dict(d.get("kw", {})),
            rate=Rate(float(d["r"]), int(d["b"])) if "r" in d else None,
            key_rate=Rate(float(d["kr"]), int(d["kb"])) if "kr" in d else None,
        )

    def to_json(self) -> dict[str, Any]:
        """For the DB row and the CLI: plain JSON types, class names spelled out."""
        return {
            "paused": sorted(c.name.lower() for c in self.paused),
            "concurrency": self.concurrency,
            "key_concurrency": self.key_concurrency,
            "key_concurrency_overrides": dict(self.key_concurrency_overrides),
            "key_weights": dict(self.key_weights),
            "rate": None if self.rate is None else {"per_s": self.rate.per_s, "burst": self.rate.burst},
            "key_rate": None
            if self.key_rate is None
            else {"per_s": self.key_rate.per_s, "burst": self.key_rate.burst},
            "retain_finished_s": self.retain_finished_s,
            "retain_dead_s": self.retain_dead_s,
        }

    @classmethod
    def from_json(cls, job_type: str, d: Mapping[str, Any]) -> QueueSettings:
        def rate(value: Any) -> Rate | None:
            return None if not value else Rate(float(value["per_s"]), int(value["burst"]))

        return validated(
            cls(
                job_type,
                paused=frozenset(Priority.parse(c) for c in d.get("paused", ())),
                concurrency=int(d.get("concurrency", 0)),
                key_concurrency=int(d.get("key_concurrency", 0)),
                key_concurrency_overrides=dict(d.get("key_concurrency_overrides") or {}),
                key_weights=dict(d.get("key_weights") or {}),
                rate=rate(d.get("rate")),
                key_rate=rate(d.get("key_rate")),
                retain_finished_s=int(d.get("retain_finished_s", 0)),
                retain_dead_s=int(d.get("retain_dead_s", 0)),
            )
        )


_DEFAULT_PACKED = msgpack.packb({})


def concurrency_key(value: str, field: str) -> str:
    """A job's concurrency key ('' for none)."""
    if len(value) > MAX_CONCURRENCY_KEY_LENGTH:
        raise InvalidArgument(f"{field}: longer than {MAX_CONCURRENCY_KEY_LENGTH} characters")
    if not value.isprintable():
        raise InvalidArgument(f"{field}: must not contain control characters")
    return value


def _limit(value: int, field: str, upper: int) -> None:
    if not 0 <= value <= upper:
        raise InvalidArgument(f"{field}: {value} is not a limit: give 1..{upper}, or 0 for none")


def _rate(rate: Rate | None, field: str) -> None:
    if rate is None:
        return
    if not (math.isfinite(rate.per_s) and MIN_RATE_PER_S <= rate.per_s <= MAX_RATE_PER_S):
        raise InvalidArgument(
            f"{field}.per_s: {rate.per_s} is not a rate: give {MIN_RATE_PER_S}..{MAX_RATE_PER_S:g}"
        )
    if not 1 <= rate.burst <= MAX_BURST:
        raise InvalidArgument(f"{field}.burst: {rate.burst} is not a burst: give 1..{MAX_BURST}")


def validated(settings: QueueSettings) -> QueueSettings:
    """The settings, or InvalidArgument naming the first field out of bounds."""
    _limit(settings.concurrency, "concurrency", MAX_CONCURRENCY)
    _limit(settings.key_concurrency, "key_concurrency", MAX_CONCURRENCY)
    for name, named in (
        ("key_concurrency_overrides", settings.key_concurrency_overrides),
        ("key_weights", settings.key_weights),
    ):
        if len(named) > MAX_KEY_OVERRIDES:
            raise InvalidArgument(f"{name}: {len(named)} keys is over the limit of {MAX_KEY_OVERRIDES}")
        for key, value in named.items():
            if not key:
                raise InvalidArgument(f"{name}: a key must not be empty")
            concurrency_key(key, f"{name}[{key[:40]!r}]")
            upper = MAX_WEIGHT if name == "key_weights" else MAX_CONCURRENCY
            if not 1 <= value <= upper:
                raise InvalidArgument(f"{name}[{key[:40]!r}]: {value} is not in 1..{upper}")
    _rate(settings.rate, "rate")
    _rate(settings.key_rate, "key_rate")
    for name in ("retain_finished_s", "retain_dead_s"):
        retention(getattr(settings, name), name, allow_default=True)
    return settings


def retention(seconds: int, field: str, *, allow_default: bool = False) -> int:
    """A retention period in seconds, or InvalidArgument naming the field (0 allowed only as "the
    cluster default")."""
    if allow_default and seconds == 0:
        return seconds
    if not MIN_RETENTION_S <= seconds <= MAX_RETENTION_S:
        default = ", or 0 for the cluster default" if allow_default else ""
        raise InvalidArgument(
            f"{field}: {seconds} s is not a retention period: give {MIN_RETENTION_S}..{MAX_RETENTION_S} s"
            f"{default}"
        )
    return seconds

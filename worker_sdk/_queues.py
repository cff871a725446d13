"""Flow control of job types as Python values: ``QueueSettings`` (pause, limits, weights) and
``QueueInfo`` (a type's settings with its live figures)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from shardq_common.pb import shardq_pb2 as pb

from ._convert import PRIORITIES, PRIORITY_NAMES

CLASSES = tuple(PRIORITIES)  # "high", "default", "low"


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: ``per_s`` jobs a second, at most ``burst`` started at once after a quiet spell."""

    per_s: float
    burst: int = 1


@dataclass(frozen=True)
class QueueSettings:
    """A job type's flow control; the defaults are: running, no limit.

    paused: the priority classes that start nothing ("high", "default", "low"; all three: paused).
    concurrency: most jobs of the type running at once across the cluster (0: no limit).
    key_concurrency: most jobs of one concurrency key running at once (0: no limit), and
    key_concurrency_overrides: keys with their own limit. key_weights: a key's share of the leases
    among keys with ready jobs (default 1). rate, key_rate: token buckets for the type and per key.
    retain_finished_s, retain_dead_s: seconds the type's succeeded and cancelled, and dead, jobs are
    kept after they finished (0: the cluster's retention).
    """

    paused: tuple[str, ...] = ()
    concurrency: int = 0
    key_concurrency: int = 0
    key_concurrency_overrides: Mapping[str, int] = field(default_factory=dict)
    key_weights: Mapping[str, int] = field(default_factory=dict)
    rate: RateLimit | None = None
    key_rate: RateLimit | None = None
    retain_finished_s: int = 0
    retain_dead_s: int = 0

    def to_pb(self) -> pb.QueueSettings:
        message = pb.QueueSettings(
            paused=[_class(c) for c in self.paused],
            concurrency=self.concurrency,
            key_concurrency=self.key_concurrency,
            key_concurrency_overrides=dict(self.key_concurrency_overrides),
            key_weights=dict(self.key_weights),
            retain_finished_s=self.retain_finished_s,
            retain_dead_s=self.retain_dead_s,
        )
        for name in ("rate", "key_rate"):
            bucket = _rate(getattr(self, name), name)
            if bucket is not None:
                getattr(message, name).CopyFrom(pb.TokenBucket(per_s=bucket.per_s, burst=bucket.burst))
        return message

    @classmethod
    def from_pb(cls, m: pb.QueueSettings) -> QueueSettings:
        return cls(
            paused=tuple(PRIORITY_NAMES.get(p, str(p)) for p in m.paused),
            concurrency=m.concurrency,
            key_concurrency=m.key_concurrency,
            key_concurrency_overrides=dict(m.key_concurrency_overrides),
            key_weights=dict(m.key_weights),
            rate=RateLimit(m.rate.per_s, m.rate.burst) if m.HasField("rate") else None,
            key_rate=RateLimit(m.key_rate.per_s, m.key_rate.burst) if m.HasField("key_rate") else None,
            retain_finished_s=m.retain_finished_s,
            retain_dead_s=m.retain_dead_s,
        )


SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(QueueSettings))


@dataclass(frozen=True)
class QueueInfo:
    """A job type's settings and, right now: its jobs delayed, ready and running (leased), its
    concurrency keys with a job running and those of them at their limit."""

    job_type: str
    settings: QueueSettings
    shard: int
    delayed: int
    ready: int
    running: int
    keys_running: int
    keys_at_limit: int
    updated_at_ms: int  # when its settings last changed; 0: never set

    @property
    def paused(self) -> bool:
        """Every class paused: nothing of the type starts."""
        return set(self.settings.paused) >= set(CLASSES)

    @classmethod
    def from_pb(cls, m: pb.QueueInfo) -> QueueInfo:
        return cls(
            job_type=m.type,
            settings=QueueSettings.from_pb(m.settings),
            shard=m.shard,
            delayed=m.delayed,
            ready=m.ready,
            running=m.running,
            keys_running=m.keys_running,
            keys_at_limit=m.keys_at_limit,
            updated_at_ms=m.updated_at_ms,
        )


def settings_request(
    job_type: str, settings: QueueSettings | None, changes: Mapping[str, Any]
) -> pb.SetQueueSettingsRequest:
    """Whole ``settings`` (every field set), or only the fields named in ``changes``."""
    if settings is not None and changes:
        raise ValueError("give settings (replaced whole) or fields to change, not both")
    unknown = set(changes) - set(SETTING_NAMES)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}: use {', '.join(SETTING_NAMES)}")
    if settings is None:
        values = {k: v for k, v in changes.items() if k not in ("paused", "rate", "key_rate")}
        settings = QueueSettings(
            paused=tuple(changes.get("paused") or ()),
            rate=_rate(changes.get("rate"), "rate"),
            key_rate=_rate(changes.get("key_rate"), "key_rate"),
            **values,
        )
        names = list(changes)
    else:
        names = []  # every field
    return pb.SetQueueSettingsRequest(type=job_type, settings=settings.to_pb(), fields=names)


def pause_request(job_type: str, priority: str | None) -> pb.PauseQueueRequest:
    every_class = priority is None  # PRIORITY_UNSPECIFIED: the request's every class
    return pb.PauseQueueRequest(
        type=job_type, priority=pb.PRIORITY_UNSPECIFIED if every_class else _class(priority or "")
    )


def _class(name: str) -> pb.Priority:
    if name not in PRIORITIES:
        raise ValueError(f"unknown priority {name!r}: use high, default or low")
    return PRIORITIES[name]


def _rate(value: Any, name: str) -> RateLimit | None:
    """A RateLimit, a (per_s, burst) pair, a number of jobs a second, or None."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return RateLimit(float(value[0]), int(value[1]))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return RateLimit(float(value))
    raise ValueError(
        f"{name}: {value!r} is not a rate: give RateLimit(per_s, burst), (per_s, burst) or per_s"
    )

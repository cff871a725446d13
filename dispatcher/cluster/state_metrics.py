"""The /metrics endpoint, and the state of the queues it reports: the cluster's, not a process's
(depth by type, priority class and state, oldest ready job, shard owners and epochs, live
dispatchers), read from Redis at scrape time so that every scrape is current. The events each
process counts are the instruments of ops/metrics.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shardq_common.clock import steady_ms, wall_ms
from shardq_common.errors import ConfigError

from ..ops.metrics import PRIORITY_NAMES, type_label
from ..queue.flow import QueueSettings
from ..queue.keys import ALIVE_KEY, ShardKeys
from ..queue.records import JobRecord


class QueueCollector(Collector):
    """Queue depth, oldest ready job and shard ownership, read from Redis when scraped."""

    def __init__(self, redis_url: str, shard_count: int, type_limit: int) -> None:
        self.redis_url = redis_url
        self.shard_count = shard_count
        self.type_limit = type_limit
        self._client: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            from ..ops.redis_client import anchor_steady_clock_sync, connect_sync

            self._client = connect_sync(self.redis_url)
            # Ownership and membership deadlines are compared below: on the clock that wrote them.
            anchor_steady_clock_sync(self._client)
        return self._client

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "shardq_queue_depth",
                "Jobs by type, priority class and state.",
                labels=["type", "priority", "state"],
            ),
            GaugeMetricFamily(
                "shardq_oldest_ready_age_seconds", "Age of the oldest ready job.", labels=["type", "priority"]
            ),
            GaugeMetricFamily(
                "shardq_shard_epoch", "Fencing epoch of each shard's owner.", labels=["shard", "owner"]
            ),
            GaugeMetricFamily("shardq_dispatchers_alive", "Dispatcher processes with a live membership."),
            # A count, not a per-shard series: which shards, `dispatcherctl shards` tells.
            GaugeMetricFamily(
                "shardq_shards_without_owner",
                "Shards no dispatcher holds a live ownership lease on (never taken, released, or lapsed).",
            ),
            # Flow control (dispatcher/queue/flow.py), from the settings the lease scripts read.
            GaugeMetricFamily("shardq_queue_running", "Jobs of the type leased now.", labels=["type"]),
            GaugeMetricFamily(
                "shardq_queue_concurrency_limit",
                "The type's concurrency limit, for the types that have one.",
                labels=["type"],
            ),
            GaugeMetricFamily(
                "shardq_queue_keys_at_limit",
                "Concurrency keys of the type running as many jobs as their limit allows.",
                labels=["type"],
            ),
            GaugeMetricFamily(
                "shardq_queue_paused",
                "1 for each paused priority class of a type.",
                labels=["type", "priority"],
            ),
        ]

    def describe(self) -> Iterable[GaugeMetricFamily]:
        """The families without reading Redis (a registry asks for them when this is registered)."""
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        depth, oldest, owned, members, unowned, running, limit, at_limit, paused = families = self._families()
        try:
            redis = self._redis()
            shards = list(range(self.shard_count))
            pipe = redis.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(ShardKeys(shard).counts)
                pipe.hmget(ShardKeys(shard).meta, "owner", "epoch", "until")
                pipe.hgetall(ShardKeys(shard).flow)
            replies = pipe.execute()
            totals: dict[tuple[str, str, str], int] = {}
            ready: list[tuple[int, str, int]] = []
            types: set[str] = set()
            without_owner = 0
            steady_now = steady_ms()  # ownership leases run on the steady clock
            leased: dict[str, int] = {}
            flows: list[tuple[int, QueueSettings]] = []
            for i, shard in enumerate(shards):
                for field, raw in replies[3 * i + 2].items():
                    flows.append((shard, QueueSettings.unpack(field.decode(), raw)))
                for field, value in replies[3 * i].items():
                    job_type, prio, state = field.decode().rsplit("|", 2)
                    label = job_type if job_type in types or len(types) < self.type_limit else "other"
                    types.add(label)
                    key = (label, PRIORITY_NAMES.get(int(prio), prio), state)
                    totals[key] = totals.get(key, 0) + int(value)
                    if state == "ready":
                        ready.append((shard, job_type, int(prio)))
                    elif state == "leased":
                        leased[label] = leased.get(label, 0) + int(value)
                owner, epoch, until = replies[3 * i + 1]
                if epoch is not None:
                    owned.add_metric([str(shard), (owner or b"").decode()], float(epoch))
                if not owner or epoch is None or int(until or 0) < steady_now:
                    without_owner += 1
            for (job_type, prio, state), value in sorted(totals.items()):
                depth.add_metric([job_type, prio, state], value)
            now = wall_ms()
            for shard, job_type, prio in ready[:500]:
                head = redis.zrange(ShardKeys(shard).ready(job_type, prio), 0, 0)
                raw = redis.hget(ShardKeys(shard).jobs, head[0]) if head else None
                if raw:
                    label = job_type if job_type in types else "other"
                    age = max(0.0, (now - JobRecord.unpack(raw).run_at_ms) / 1000)
                    oldest.add_metric([label, PRIORITY_NAMES.get(prio, str(prio))], age)
            for label, n in sorted(leased.items()):
                running.add_metric([label], n)
            self._flow(redis, flows, types, limit, at_limit, paused)
            members.add_metric([], float(redis.zcount(ALIVE_KEY, steady_ms(), "+inf")))
            unowned.add_metric([], float(without_owner))
        except Exception:  # Redis down: scrape what we have; the health check reports the outage
            self._client = None
        return families

    def _flow(
        self,
        redis: Any,
        flows: list[tuple[int, QueueSettings]],
        types: set[str],
        limit: GaugeMetricFamily,
        at_limit: GaugeMetricFamily,
        paused: GaugeMetricFamily,
    ) -> None:
        """Limits and pauses of the types with settings; keys at their limit counted from the
        running count per key the lease scripts keep (types with a per-key limit only)."""
        keyed = [
            (shard, settings)
            for shard, settings in flows
            if settings.key_concurrency or settings.key_concurrency_overrides
        ]
        pipe = redis.pipeline(transaction=False)
        for shard, settings in keyed[: self.type_limit]:
            pipe.hgetall(ShardKeys(shard).key_running(settings.job_type))
        counts = dict(zip((s.job_type for _, s in keyed), pipe.execute(), strict=False))
        for _, settings in flows:
            job_type = settings.job_type
            label = job_type if job_type in types or len(types) < self.type_limit else "other"
            types.add(label)
            if settings.concurrency:
                limit.add_metric([label], settings.concurrency)
            for cls in sorted(settings.paused):
                paused.add_metric([label, PRIORITY_NAMES.get(int(cls), str(cls))], 1)
            if job_type in counts:
                full = 0
                for key, n in counts[job_type].items():
                    cap = settings.key_concurrency_overrides.get(key.decode(), settings.key_concurrency)
                    full += bool(cap) and int(n) >= cap
                at_limit.add_metric([label], full)


def serve_metrics(
    listen: str, redis_url: str | None, shard_count: int, multiprocess_dir: str | None = None
) -> None:
    """Start the /metrics HTTP server in a background thread: this process's metrics, or (a supervisor)
    the sum of its children's from ``multiprocess_dir``; plus the queue state read from Redis."""
    from prometheus_client import REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector

    host, _, port = listen.rpartition(":")
    registry: CollectorRegistry
    if multiprocess_dir:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=multiprocess_dir)
    else:
        registry = REGISTRY
    if redis_url:
        registry.register(QueueCollector(redis_url, shard_count, type_label.limit))
    try:
        start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {listen}: {exc.strerror or exc} (set SHARDQ_METRICS_LISTEN to a free "
            "address, or to an empty value to turn metrics off)"
        ) from None

"""Dispatcher settings: one frozen object, read from SHARDQ_* environment variables and flags."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shardmap import DEFAULT_SHARD_COUNT, MAX_SHARD_COUNT
from shardq_common.durations import parse_duration_ms
from shardq_common.errors import ConfigError

# A lease held back longer than this would eat into short lease TTLs (100 ms at least).
MAX_LEASE_AHEAD_MS = 50
#: The most of a traceback an attempt keeps (the worker sends at most this much of an error).
MAX_TRACEBACK_CHARS = 16_000
# Bounds of a retention period (dispatcher/queue/flow.py holds the same for per-type settings).
MIN_RETENTION_S = 60
MAX_RETENTION_S = 10 * 366 * 86_400
# Room in a request for one job's fields and framing besides its payload.
REQUEST_OVERHEAD_BYTES = 64 << 10


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff before retry n (n = failures + expirations so far, from 1):

    ``min(cap, base * 2 ** (n - 1)) * (1 + jitter * u)`` with u uniform in [-1, 1).
    With the defaults this is 1, 2, 4, 8 s; the fifth failure dead-letters a job
    whose max_attempts is 5. The formula is evaluated in one place, the Lua
    include ``retry_or_dead``; this object validates and carries its inputs.
    """

    base_ms: int = 1000
    cap_ms: int = 3_600_000
    jitter: float = 0.0
    #: Whether lease expiries count toward max_attempts (handler failures always do).
    count_expirations: bool = True

    def __post_init__(self) -> None:
        if self.base_ms < 1:
            raise ConfigError("retry base must be at least 1 ms")
        if self.cap_ms < self.base_ms:
            raise ConfigError("retry cap cannot be less than the retry base")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError("retry jitter must be between 0 and 1")


@dataclass(frozen=True)
class FairnessPolicy:
    """How lease slots are shared between priority classes high, default and low.

    Weighted: when all classes have ready jobs, each gets slots in proportion to
    its weight (default 6:3:1), so a flood of low jobs never starves high ones and a
    steady stream of high jobs still lets low ones through. Strict: always the
    highest non-empty class first.
    """

    weights: tuple[int, int, int] = (6, 3, 1)
    strict: bool = False

    def __post_init__(self) -> None:
        if len(self.weights) != 3 or any(w < 1 for w in self.weights):
            raise ConfigError("priority weights must be three integers >= 1 (high, default, low)")

    @classmethod
    def parse(cls, text: str) -> FairnessPolicy:
        """``strict`` or ``high=6,default=3,low=1`` (or ``6,3,1``)."""
        text = text.strip()
        if text == "strict":
            return cls(strict=True)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        values = [p.split("=", 1)[-1] for p in parts]
        try:
            weights = tuple(int(v) for v in values)
        except ValueError:
            raise ConfigError(
                f"bad priority weights {text!r}: use 'strict' or 'high=6,default=3,low=1'"
            ) from None
        if len(weights) != 3:
            raise ConfigError(f"bad priority weights {text!r}: three weights are needed")
        return cls(weights=(weights[0], weights[1], weights[2]))


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished jobs' rows are kept, and how the shard owner deletes them
    (dispatcher/queue/pruner.py). A job type's own periods (``dispatcherctl queue retention``)
    override the two periods here.
    """

    #: SHARDQ_RETENTION_SUCCEEDED: succeeded and cancelled jobs are deleted this long after they
    #: finished (default 7 days). A duration: 90s, 12h, 7d.
    succeeded_s: int = 7 * 86_400
    #: SHARDQ_RETENTION_DEAD: dead-lettered jobs are deleted this long after they died (30 days).
    dead_s: int = 30 * 86_400
    #: SHARDQ_RETENTION_BATCH: rows one DELETE statement removes at most.
    batch: int = 1000
    #: SHARDQ_RETENTION_PAUSE_MS: the pause between two batches, which leaves the DB to the hot path.
    pause_ms: int = 50
    #: SHARDQ_RETENTION_PASS_ROWS: rows one shard's pass deletes at most before it waits for the
    #: next pass (so one shard with a backlog does not hold a DB connection for long).
    pass_rows: int = 100_000
    #: SHARDQ_RETENTION_INTERVAL: time between two passes over a shard (default a minute). 0: no
    #: retention (rows are kept until ``dispatcherctl jobs prune`` deletes them).
    interval_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value in (
            ("SHARDQ_RETENTION_SUCCEEDED", self.succeeded_s),
            ("SHARDQ_RETENTION_DEAD", self.dead_s),
        ):
            if not MIN_RETENTION_S <= value <= MAX_RETENTION_S:
                raise ConfigError(
                    f"{name}: {value} s is not a retention period: give {MIN_RETENTION_S} s .. 10 years"
                )
        if not 1 <= self.batch <= 10_000:
            raise ConfigError("SHARDQ_RETENTION_BATCH must be in 1..10000 rows")
        if not 0 <= self.pause_ms <= 60_000:
            raise ConfigError("SHARDQ_RETENTION_PAUSE_MS must be in 0..60000")
        if self.pass_rows < self.batch:
            raise ConfigError("SHARDQ_RETENTION_PASS_ROWS must be at least SHARDQ_RETENTION_BATCH")
        if self.interval_s != 0 and not 1 <= self.interval_s <= 86_400:
            raise ConfigError("SHARDQ_RETENTION_INTERVAL must be 1 s .. 1 d, or 0 for no retention")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RetentionPolicy:
        values: dict[str, Any] = {}
        for name, key in (
            ("succeeded_s", "SHARDQ_RETENTION_SUCCEEDED"),
            ("dead_s", "SHARDQ_RETENTION_DEAD"),
            ("interval_s", "SHARDQ_RETENTION_INTERVAL"),
        ):
            if env.get(key):
                try:
                    ms = parse_duration_ms(env[key])
                except ValueError as exc:
                    raise ConfigError(f"{key}: {exc}") from None
                values[name] = ms / 1000 if name == "interval_s" else ms // 1000
        for name, key in (
            ("batch", "SHARDQ_RETENTION_BATCH"),
            ("pause_ms", "SHARDQ_RETENTION_PAUSE_MS"),
            ("pass_rows", "SHARDQ_RETENTION_PASS_ROWS"),
        ):
            if env.get(key):
                try:
                    values[name] = int(env[key])
                except ValueError:
                    raise ConfigError(f"{key}={env[key]!r} is not a whole number") from None
        return cls(**values)


@dataclass(frozen=True)
class Settings:
    """Everything a dispatcher process reads at start. Defaults are documented per field."""

    #: SHARDQ_REDIS_URL. Unset: start a private redis-server child for this process.
    redis_url: str | None = None
    #: SHARDQ_DB_URL: postgresql://... or sqlite:///path. Unset: sqlite:///<data_dir>/shardq.sqlite3.
    db_url: str | None = None
    #: SHARDQ_DATA_DIR: where the embedded defaults keep files.
    data_dir: str = "shardq-data"
    #: SHARDQ_LISTEN: gRPC address.
    listen: str = "127.0.0.1:7070"
    #: SHARDQ_ADVERTISE: the address workers and other dispatchers use to reach this process.
    #: Unset: the listen address, with a wildcard host replaced by this machine's hostname.
    advertise: str | None = None
    #: SHARDQ_DISPATCHER_ID: this process's member id. Unset: <hostname>-<advertised port>, so a process
    #: restarted in the same place takes its shards back at once instead of after the ownership TTL.
    dispatcher_id: str | None = None
    #: SHARDQ_OWNERSHIP_TTL_MS: a shard whose owner stops renewing is taken over after this long.
    ownership_ttl_ms: int = 6_000
    #: SHARDQ_PROCESSES: dispatcher processes a supervisor runs (``dispatcher run``). 1: no supervisor.
    processes: int = 1
    #: SHARDQ_SHARED_LISTEN: set by the supervisor for its children, which share the listen address.
    shared_listen: bool = False
    #: SHARDQ_ADVERTISE_HOST: the host part of the advertised address (e.g. a pod IP), when
    #: SHARDQ_ADVERTISE is unset; the port is the one this process listens on.
    advertise_host: str | None = None
    #: SHARDQ_METRICS_LISTEN: where /metrics is served (host:port). Empty: no metrics endpoint.
    metrics_listen: str = "127.0.0.1:9464"
    #: SHARDQ_SHARD_COUNT: logical shards, fixed when a cluster is first created.
    shard_count: int = DEFAULT_SHARD_COUNT
    #: SHARDQ_LEASE_TTL_MS: default lease TTL of a job.
    lease_ttl_ms: int = 60_000
    #: SHARDQ_MAX_ATTEMPTS: default max_attempts of a job.
    max_attempts: int = 5
    #: SHARDQ_RECONNECT_GRACE_MS: how long a disconnected worker's leases stay valid for it to reclaim.
    reconnect_grace_ms: int = 5_000
    #: SHARDQ_MAX_PAYLOAD_BYTES: largest accepted payload (1 MiB).
    max_payload_bytes: int = 1 << 20
    #: SHARDQ_MAX_RESULT_BYTES: largest stored ack result (64 KiB).
    max_result_bytes: int = 64 << 10
    #: SHARDQ_ATTEMPT_HISTORY: keep each run of a job (worker, start, end, outcome, error, traceback)
    #: in the job_attempts table, written with the status updates' batches. Off: GetJob lists none.
    attempt_history: bool = True
    #: SHARDQ_MAX_TRACEBACK_CHARS: the most of a failed attempt's traceback kept (its end: the frames
    #: nearest the error and the error itself). 0: none kept, only the error line.
    max_traceback_chars: int = 8_000
    #: SHARDQ_MAX_PROGRESS_BYTES: largest progress report (JSON: a fraction 0..1 or a small object).
    max_progress_bytes: int = 4_096
    #: SHARDQ_MAX_WATCHES: most WatchJob streams (and client waits) open at once in this process;
    #: one more is refused with RESOURCE_EXHAUSTED. Each costs a memory slot and a read of the job
    #: every WATCH_RECHECK_S while its owner is another process.
    max_watches: int = 1_000
    #: SHARDQ_MAX_BATCH: most jobs in one EnqueueMany.
    max_batch: int = 10_000
    #: SHARDQ_MAX_REQUEST_BYTES: largest message any RPC accepts (64 MiB), a whole EnqueueMany or
    #: worker message included: a larger one is refused with RESOURCE_EXHAUSTED before it is decoded.
    #: At least max_payload_bytes + 64 KiB (one job with the largest payload fits).
    max_request_bytes: int = 64 << 20
    #: SHARDQ_MAX_LEASE_REFS: most leases one worker message names (hello.held, a heartbeat, acks,
    #: nacks); a worker's concurrency is at most 10,000, so it never needs more.
    max_lease_refs: int = 10_000
    #: SHARDQ_MAX_WORKER_TYPES: most job types one worker declares in its hello.
    max_worker_types: int = 1_000
    #: SHARDQ_FLUSH_INTERVAL_MS: how long status writes gather before one DB transaction.
    flush_interval_ms: int = 10
    #: SHARDQ_RECONCILE_INTERVAL_S: full DB-vs-Redis sweep period (also run at start and on data loss).
    reconcile_interval_s: float = 300.0
    #: SHARDQ_SQL_ENQUEUE_SWEEP_S: how often the jobs producers enqueued in their own PostgreSQL
    #: transactions are looked for without a notification (one missed while the LISTEN connection
    #: was down). Notified jobs are pushed at their commit.
    sql_enqueue_sweep_s: float = 1.0
    #: SHARDQ_LEASE_BATCH: most leases sent to one worker in one message.
    lease_batch: int = 256
    #: SHARDQ_LEASE_AHEAD_MS: a delayed job is made ready and leased this long before its run_at; the
    #: lease waits in the dispatcher and goes to the worker at the instant, so the job starts without
    #: the promote and lease round trips in between. 0: promoted at the instant.
    lease_ahead_ms: int = 20
    #: SHARDQ_SCHEDULE_TICK_MS: how often a shard owner looks for due schedule occurrences.
    schedule_tick_ms: int = 1_000
    #: SHARDQ_SCHEDULE_LOOKAHEAD_MS: occurrences become delayed jobs this long before they are due,
    #: so they start on time (the promoter runs them at their second), not a tick late.
    schedule_lookahead_ms: int = 5_000
    #: SHARDQ_SCHEDULE_MISFIRE_GRACE_MS: an occurrence materialized later than this after its time
    #: counts as missed and goes to the catch-up policy (longer than an ownership failover).
    schedule_misfire_grace_ms: int = 15_000
    #: SHARDQ_SCHEDULES_FILE: a TOML file of schedules upserted at start (deploys declare them).
    schedules_file: str | None = None
    #: SHARDQ_QUEUES_FILE: a TOML file of queue settings (pause, limits) set at start, one
    #: ``[queues.TYPE]`` table per job type (see dispatcher/schedules/queues_file.py).
    queues_file: str | None = None
    #: SHARDQ_HEALTH_LISTEN: a plaintext address serving grpc.health.v1 only, for probes that cannot
    #: speak TLS (Kubernetes' grpc probes). Empty: health is served on the gRPC address only.
    health_listen: str = ""
    #: SHARDQ_TLS_CERT, SHARDQ_TLS_KEY: PEM certificate chain and key; set: every gRPC port is TLS.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: SHARDQ_TLS_CLIENT_CA: PEM CA bundle; set: clients must present a certificate it signed (mTLS).
    tls_client_ca: str | None = None
    #: SHARDQ_TLS_CA: the CA that signed the other dispatchers' certificates, for hand-offs between
    #: them. Unset: the system roots.
    tls_ca: str | None = None
    #: SHARDQ_TLS_SERVER_NAME: the name checked in another dispatcher's certificate instead of the
    #: host of its advertised address (a pod IP the certificate cannot name).
    tls_server_name: str | None = None
    #: SHARDQ_AUTH_TOKENS_FILE, or the same text in SHARDQ_AUTH_TOKENS: bearer tokens with roles (see
    #: auth.py). Neither set: no authentication.
    auth_tokens_file: str | None = None
    auth_tokens: str | None = field(default=None, repr=False)
    #: SHARDQ_PEER_TOKEN: the token dispatchers send each other (role peer). Unset with auth on: a
    #: supervisor makes one for its own processes; separate pods need a shared one.
    peer_token: str | None = field(default=None, repr=False)
    #: SHARDQ_TRACE_SPANS: emit OpenTelemetry spans of the dispatcher's commit, push and lease batches
    #: (needs opentelemetry-api and a tracer provider in the process; see dispatcher/ops/tracing.py).
    #: Off by default: the client's send and the worker's process spans make the trace without them.
    trace_spans: bool = False
    #: SHARDQ_LOG_LEVEL and SHARDQ_LOG_FORMAT (auto, json, console).
    log_level: str = "info"
    log_format: str = "auto"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fairness: FairnessPolicy = field(default_factory=FairnessPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)

    def __post_init__(self) -> None:
        if not 1 <= self.shard_count <= MAX_SHARD_COUNT:
            raise ConfigError(f"shard count must be in 1..{MAX_SHARD_COUNT}")
        for name in (
            "lease_ttl_ms",
            "max_attempts",
            "max_payload_bytes",
            "max_batch",
            "lease_batch",
            "max_lease_refs",
            "max_worker_types",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.max_request_bytes < self.max_payload_bytes + REQUEST_OVERHEAD_BYTES:
            raise ConfigError(
                f"max_request_bytes must be at least max_payload_bytes + {REQUEST_OVERHEAD_BYTES} "
                "(a request with one job of the largest payload)"
            )
        if not 0 <= self.max_traceback_chars <= MAX_TRACEBACK_CHARS:
            raise ConfigError(f"max_traceback_chars must be in 0..{MAX_TRACEBACK_CHARS}")
        if not 16 <= self.max_progress_bytes <= 64 << 10:
            raise ConfigError("max_progress_bytes must be in 16..65536")
        if not 1 <= self.max_watches <= 100_000:
            raise ConfigError("max_watches must be in 1..100000")
        if self.ownership_ttl_ms < 1000:
            raise ConfigError("ownership TTL must be at least 1000 ms")
        if not 1 <= self.processes <= 256:
            raise ConfigError("processes must be in 1..256")
        if not 0.05 <= self.sql_enqueue_sweep_s <= 3600:
            raise ConfigError("the SQL enqueue sweep must be every 0.05..3600 s")
        if self.reconnect_grace_ms < 0 or self.flush_interval_ms < 0:
            raise ConfigError("durations cannot be negative")
        if not 0 <= self.lease_ahead_ms <= MAX_LEASE_AHEAD_MS:
            raise ConfigError(f"lease ahead must be in 0..{MAX_LEASE_AHEAD_MS} ms")
        if not 10 <= self.schedule_tick_ms <= 60_000:
            raise ConfigError("schedule tick must be in 10..60000 ms")
        if not 0 <= self.schedule_lookahead_ms <= 3_600_000 or self.schedule_misfire_grace_ms < 0:
            raise ConfigError(
                "schedule lookahead must be in 0..3600000 ms and the misfire grace not negative"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("set both SHARDQ_TLS_CERT and SHARDQ_TLS_KEY (a certificate and its key)")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("SHARDQ_TLS_CLIENT_CA (mutual TLS) needs SHARDQ_TLS_CERT and SHARDQ_TLS_KEY")

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens_file or self.auth_tokens)

    def advertised(self, port: int) -> str:
        """The address peers and workers should use, given the port actually bound."""
        if self.advertise:
            return self.advertise
        host = self.advertise_host or self.listen.rsplit(":", 1)[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"{host}:{port}"

    def member_id(self, advertise: str) -> str:
        """This process's id among the dispatchers (see dispatcher_id)."""
        return self.dispatcher_id or f"{socket.gethostname()}-{advertise.rsplit(':', 1)[-1]}"

    def resolved_db_url(self) -> str:
        return self.db_url or f"sqlite:///{os.path.join(self.data_dir, 'shardq.sqlite3')}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        simple = {f.name: f for f in fields(cls) if f.name not in ("retry", "fairness", "retention")}
        for name, f in simple.items():
            raw = env.get(f"SHARDQ_{name.upper()}")
            if raw is None or (raw == "" and name not in ("metrics_listen", "health_listen")):
                continue
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            try:
                if kind.startswith("bool"):
                    values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
                elif kind.startswith("int"):
                    values[name] = int(raw)
                elif kind.startswith("float"):
                    values[name] = float(raw)
                else:
                    values[name] = raw
            except ValueError:
                raise ConfigError(f"SHARDQ_{name.upper()}={raw!r} is not a number") from None
        retry = RetryPolicy()
        try:
            if "SHARDQ_RETRY_BASE_MS" in env:
                retry = replace(retry, base_ms=int(env["SHARDQ_RETRY_BASE_MS"]))
            if "SHARDQ_RETRY_CAP_MS" in env:
                retry = replace(retry, cap_ms=int(env["SHARDQ_RETRY_CAP_MS"]))
            if "SHARDQ_RETRY_JITTER" in env:
                retry = replace(retry, jitter=float(env["SHARDQ_RETRY_JITTER"]))
        except ValueError as exc:
            raise ConfigError(f"bad SHARDQ_RETRY_* value: {exc}") from None
        if "SHARDQ_COUNT_EXPIRATIONS" in env:
            retry = replace(
                retry, count_expirations=env["SHARDQ_COUNT_EXPIRATIONS"].lower() in ("1", "true", "yes")
            )
        values["retry"] = retry
        if env.get("SHARDQ_PRIORITY_WEIGHTS"):
            values["fairness"] = FairnessPolicy.parse(env["SHARDQ_PRIORITY_WEIGHTS"])
        values["retention"] = RetentionPolicy.from_env(env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

"""Which Redis errors are outages (retry later) and which are bugs: for the loops that survive
them, the RPCs that answer UNAVAILABLE, and the shardq_redis_errors_total label."""

from __future__ import annotations

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Redis unreachable or restarting: loops back off and retry; RPCs answer UNAVAILABLE.
REDIS_DOWN: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

# Anything a Redis call can raise, error replies included. Every long-lived loop survives these
# (redis_faults.note_redis_error: logged, counted, then it backs off): a reachable Redis refuses
# writes for a while after a failover (READONLY), at maxmemory (OOM), when it cannot persist
# (MISCONF) and so on, and even a script error that is a bug must not end a loop for good.
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)

# Error replies of a Redis that is there but cannot serve writes (or anything) for now: retrying
# later can succeed, so an RPC meeting one answers UNAVAILABLE. Any other error reply (a script
# error, a wrong type, NOPERM) is no outage: INTERNAL, logged as an error.
TRANSIENT_REPLIES = frozenset(
    {
        "READONLY",  # the server is a replica now (failover)
        "OOM",  # maxmemory reached with the noeviction policy
        "MISCONF",  # stop-writes-on-bgsave-error after a failed save (disk full)
        "NOREPLICAS",  # min-replicas-to-write not met
        "BUSY",  # a script or function runs past busy-reply-threshold
        "LOADING",  # the dataset is being loaded at start
        "MASTERDOWN",  # a replica lost its master (replica-serve-stale-data no)
        "TRYAGAIN",  # Redis Cluster: a slot is being migrated
        "CLUSTERDOWN",  # Redis Cluster: some slot is not served
        "UNBLOCKED",  # a blocked client was unblocked by a role change
        "NOSCRIPT",  # after the reload: two connections reach servers with different script caches
    }
)
_REPLY_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (ReadOnlyError, "READONLY"),
    (OutOfMemoryError, "OOM"),
    (MasterDownError, "MASTERDOWN"),
    (ClusterDownError, "CLUSTERDOWN"),
    (TryAgainError, "TRYAGAIN"),
    (BusyLoadingError, "LOADING"),
    (NoScriptError, "NOSCRIPT"),
)


def redis_error_kind(exc: BaseException) -> str:
    """What kind of Redis error this is, for logs and the shardq_redis_errors_total label:
    "connection", "timeout", a transient reply code in lower case ("readonly", "oom", "misconf",
    ...), or "other" (an error reply that is no outage: most likely a bug)."""
    kind = getattr(exc, "redis_error_kind", None)  # set by redis_client's own error classes
    if isinstance(kind, str):
        return kind
    if isinstance(exc, RedisTimeoutError):
        return "timeout"
    for cls, code in _REPLY_CLASSES:  # redis-py strips these codes from the message
        if isinstance(exc, cls):
            return code.lower()
    if isinstance(exc, (RedisConnectionError, OSError)):
        return "connection"
    code = str(exc).split(" ", 1)[0]
    return code.lower() if code in TRANSIENT_REPLIES else "other"


def redis_transient(exc: BaseException) -> bool:
    """Whether trying again later can succeed: Redis down, or a transient error reply."""
    return redis_error_kind(exc) != "other"

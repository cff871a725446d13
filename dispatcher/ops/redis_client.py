"""The dispatcher's Redis client: one Redis server, or a Redis Cluster, chosen by the URL scheme.

URLs
----
``redis://[[user]:password@]host[:port][/db][?option=value...]``
    One Redis server over TCP (``rediss://`` for TLS, ``unix://[[user]:password@]/path?db=N`` for a
    Unix socket). Parsed by redis-py; its query options (e.g. ``ssl_cert_reqs``) apply.
``redis+cluster://[[user]:password@]host:port[,host:port...][/0]``
    A Redis Cluster, given by one or more seed nodes (IPv6 hosts in brackets, ``[::1]:7000``; the
    port defaults to 6379). The seeds are only used to discover the cluster (``CLUSTER SLOTS``);
    from then on each command goes to the master that serves its key's slot. Listing several seeds
    lets the dispatcher start while one of them is down. ``rediss+cluster://`` is the same over TLS
    and accepts the query options ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs`` and ``ssl_check_hostname``. A cluster has database 0 only.

Why the code runs unchanged on a cluster: every key of one shard carries the hash tag ``{s<N>}``
(see keys.py), so all of a shard's keys live in one slot, and every Lua script receives all the
keys it touches in KEYS. redis-py's cluster client routes ``EVALSHA`` by the slot of its keys
(``RedisCluster._determine_slot``: it takes ``args[2:2 + numkeys]`` and refuses, client-side,
keys of different slots with "all keys must map to the same key slot"). On ``NOSCRIPT``,
redis-py's registered script runs ``SCRIPT LOAD`` on every master, which fails while any master is
down; the cluster client made here answers ``NOSCRIPT`` with an ``EVAL`` of the source instead,
routed like the ``EVALSHA`` to the one master that serves the keys (and caching the script there).
``pipeline(transaction=False)``
on a cluster splits the queued commands per master and runs the parts concurrently, so one
round trip per master, whatever slots the keys are in.

Failover
--------
Behind an address that follows the master (Sentinel-managed DNS or virtual IP, a managed service's
endpoint, a proxy), a failover can leave open connections on the old master, now a replica that
answers every write with ``READONLY``, and answers reads (and scripts that end up writing nothing,
such as an ack with a token it has never seen) from its stale data. On a single server a
``READONLY`` reply makes every connection of the client connect again, since all of them may reach
the demoted server, and raises :class:`ReadOnlyReplica` (a ``ConnectionError``, as redis-py's own
Sentinel client does): the command is retried on a new connection, which reaches the new master. A
script refused with ``READONLY`` wrote nothing, so running it again is safe. The coordinator's
failover watch (failover.py) does the same when it sees another master, or a replica, answer. A
connection in use is closed only once its command's reply is read (:func:`reconnect_all`): closed
under the command, it would have the command retried after the server may have run it.

Both kinds of client use ``decode_responses=False``, TCP keepalive, a 5 s connect timeout, a 10 s
read timeout and, on a single server, a ``PING`` health check of connections idle for 10 s.

Retries (redis-py 8 defaults to 10 retries with backoff: about 4.5 s before a refused connection
raises, and timeouts are retried too): here a failed command is retried at most 3 times, on
connection errors only, after a capped exponential backoff with equal jitter (base 50 ms, cap
500 ms: waits of 50-100, 100-200 and 200-400 ms), so a dead Redis raises ``ConnectionError``
within about 0.4-0.7 s. Timeouts are not retried: a server that did not answer within 10 s is
reported at once rather than after 40 s, and a script that may have run is not run again. The
cluster client retries a command up to 3 times as well, re-reading the topology between tries
(redis-py does not back off there, apart from 250 ms after ``CLUSTERDOWN``).

On a cluster, "Redis is unavailable" also shows up as errors that are not ``ConnectionError``:
``RedisClusterException`` when no seed node answers or the slots are not all covered, and
``ClusterDownError`` / ``SlotNotCoveredError`` while the cluster is down. The cluster client made
here raises :class:`ClusterUnavailable` (a ``redis.exceptions.ConnectionError``) for those, so the
code that backs off on ``redis_errors.REDIS_DOWN`` treats a down cluster like a down server. Errors in
the caller's request (such as keys of different slots in one script) are raised unchanged.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline
from redis.asyncio.cluster import RedisCluster as _RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
)

from shardq_common.clock import anchor_steady, elapsed_ns
from shardq_common.errors import ConfigError

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
SINGLE_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PORT = 6379

SOCKET_CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 10.0
HEALTH_CHECK_INTERVAL_S = 10
MAX_CONNECTIONS = 64  # per process
RETRIES = 3
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 0.5

_CLUSTER_QUERY_OPTIONS: dict[str, Callable[[str], Any]] = {
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": lambda v: v.strip().lower() in ("1", "true", "yes"),
}


def retry_policy() -> Retry:
    """At most 3 retries on connection errors, 50 ms * 2^n backoff capped at 500 ms, equal jitter."""
    return Retry(
        EqualJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S),
        RETRIES,
        supported_errors=(ConnectionError,),
    )


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def connect(url: str, client_name: str | None = None) -> Any:
    """A ``redis.asyncio.Redis`` for redis:// rediss:// unix:// URLs, a ``RedisCluster`` for
    redis+cluster:// and rediss+cluster:// URLs (see the module docstring). Nothing is connected
    yet: the first command opens the connections (and, on a cluster, discovers the topology)."""
    scheme = url.partition("://")[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return _connect_cluster(url, client_name)
    if scheme not in SINGLE_SCHEMES:
        raise ConfigError(
            f"unsupported Redis URL scheme {scheme!r}: use redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster://"
        )
    # A blocking pool: when every connection is busy (all shards' loops start at once) a command
    # waits for one instead of failing with "Too many connections".
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=SOCKET_TIMEOUT_S,
        decode_responses=False,
        socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=retry_policy(),
        client_name=client_name,  # CLIENT LIST shows which dispatcher a connection belongs to
    )
    # No connection exists yet.
    pool.connection_class = _following_the_master(_with_c_packer(pool.connection_class), pool)
    return aioredis.Redis.from_pool(pool)  # closing the client closes the pool


@cache
def _with_c_packer(base: type[Any]) -> type[Any]:
    """The connection class, packing commands with hiredis (C) instead of redis-py's Python loop:
    about 6x less client CPU for the scripts' long argument lists (a batch of 1,000 new jobs is
    4,000 arguments). The same bytes go on the wire."""

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):  # "CONFIG GET" and the like go as separate words
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]

    return type(f"CPacked{base.__name__}", (base,), {"pack_command": pack_command})


async def reconnect_all(pool: Any) -> None:
    """Make every connection of ``pool`` connect again, through the URL, before its next command:
    the idle ones are closed now, and those in use once their command's reply is read. Closing a
    connection in use would cut its command after the server may have run it, and the retry would
    run it again (a lease script granting its jobs twice, the first grant never sent).

    Under the pool's lock, which taking a connection from the pool and giving one back also hold:
    without it, a task could take an idle connection and send its command between the look at the
    idle ones and their close (redis-py's own ``disconnect(inuse_connections=False)`` closes them
    outside the lock)."""
    async with pool._lock:
        for conn in pool._in_use_connections:
            conn.mark_for_reconnect()  # closed by the pool when given back (ConnectionPool.release)
        await asyncio.gather(
            *(conn.disconnect() for conn in pool._available_connections), return_exceptions=True
        )


class ReadOnlyReplica(ConnectionError):
    """The server this connection reached is a read-only replica now (a failover demoted it)."""

    redis_error_kind = "readonly"


def _following_the_master(base: type[Any], pool: Any) -> type[Any]:
    """The connection class, making every connection of ``pool`` connect again when one's server
    answers READONLY (see the module docstring), so that the retry connects again, through the URL,
    to the current master. This connection is closed by the retry itself."""
    pool_ref = weakref.ref(pool)

    async def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await base.read_response(self, *args, **kwargs)
        except ReadOnlyError as exc:
            owner = pool_ref()
            await (reconnect_all(owner) if owner is not None else self.disconnect())
            raise ReadOnlyReplica(f"the Redis server is a read-only replica now: {exc}") from exc

    return type(f"MasterFollowing{base.__name__}", (base,), {"read_response": read_response})


# -- Redis Cluster -----------------------------------------------------------------------------


class ClusterUnavailable(ConnectionError):
    """The Redis Cluster cannot serve the command now (no node reachable, cluster down, slot not
    covered). A ``ConnectionError``, so it is handled like an unreachable single server."""

    redis_error_kind = "clusterdown"


def _unavailable(exc: BaseException) -> ClusterUnavailable:
    return ClusterUnavailable(f"Redis Cluster unavailable: {exc}")


class ShardqRedisCluster(_RedisCluster):
    """``RedisCluster`` raising :class:`ClusterUnavailable` for an unreachable or down cluster."""

    # redis-py also retries TimeoutError here (10 s each); a timeout is reported at once instead,
    # as on a single server (see the module docstring).
    ERRORS_ALLOW_RETRY = (ConnectionError, ClusterDownError, SlotNotCoveredError)  # type: ignore[assignment]

    async def initialize(self, *args: Any, **kwargs: Any) -> Any:
        # Topology discovery: every RedisClusterException here means the seeds / nodes did not
        # give a usable map of the slots (none answered, slots not covered, nodes disagree).
        try:
            return await super().initialize(*args, **kwargs)
        except ConnectionError:
            raise
        except RedisClusterException as exc:
            raise _unavailable(exc) from exc

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (ClusterDownError, SlotNotCoveredError) as exc:
            raise _unavailable(exc) from exc

    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]
        return _ClusterScript(self, script)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _ShardqClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py does


class _ClusterScript(AsyncScript):
    """EVALSHA, and on NOSCRIPT an EVAL of the source, both routed by the slot of the keys.

    redis-py's script object answers NOSCRIPT with SCRIPT LOAD on *every* master, which fails
    while any one master is down: the shards on the masters that are up could then run no script
    their master had not cached yet. EVAL goes to the one master that serves the keys, and caches
    the script there for the next EVALSHA."""

    async def __call__(
        self,
        keys: Sequence[Any] | None = None,
        args: Iterable[Any] | None = None,
        client: Any | None = None,
    ) -> Any:
        keys = list(keys or [])
        argv = [*keys, *(args or [])]
        client = client or self.registered_client
        try:
            return await client.evalsha(self.sha, len(keys), *argv)
        except NoScriptError:
            return await client.eval(cast(str, self.script), len(keys), *argv)


class _ShardqClusterPipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except (ClusterDownError, SlotNotCoveredError) as exc:
            raise _unavailable(exc) from exc


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes and client options of a redis+cluster:// or rediss+cluster:// URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        raise ConfigError(f"not a Redis Cluster URL: {scheme}://")
    options: dict[str, Any] = {}
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if at:
        username, colon, password = userinfo.partition(":")
        if username:
            options["username"] = unquote(username)
        if colon:
            options["password"] = unquote(password)
    nodes = [_parse_host_port(item, url) for item in hostlist.split(",") if item.strip()]
    if not nodes:
        raise ConfigError("a Redis Cluster URL needs at least one seed node: redis+cluster://host:port")
    if parts.path not in ("", "/", "/0"):
        raise ConfigError(f"a Redis Cluster has database 0 only, not {parts.path.lstrip('/')!r}")
    tls = CLUSTER_SCHEMES[scheme]
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if not tls or name not in _CLUSTER_QUERY_OPTIONS:
            allowed = ", ".join(_CLUSTER_QUERY_OPTIONS) if tls else "none (rediss+cluster:// takes ssl_*)"
            raise ConfigError(f"unsupported Redis Cluster URL option {name!r}; supported: {allowed}")
        options[name] = _CLUSTER_QUERY_OPTIONS[name](value)
    if tls:
        options["ssl"] = True
    return nodes, options


def _parse_host_port(item: str, url: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"bad seed node {item!r} in the Redis Cluster URL")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ConfigError(f"bad seed node {item!r} in the Redis Cluster URL")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"bad port in seed node {item!r} of the Redis Cluster URL") from None
    if not 0 < port < 65536:
        raise ConfigError(f"bad port in seed node {item!r} of the Redis Cluster URL")
    return host, port


def _connect_cluster(url: str, client_name: str | None = None) -> ShardqRedisCluster:
    nodes, options = parse_cluster_url(url)
    if client_name:
        options["client_name"] = client_name
    return ShardqRedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        decode_responses=False,
        socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=retry_policy(),
        **options,
    )


def connect_sync(url: str) -> Any:
    """A blocking client for the same URL, for code outside the event loop (the metrics scrape)."""
    import redis as redis_sync
    from redis.cluster import ClusterNode as SyncClusterNode
    from redis.cluster import RedisCluster as SyncRedisCluster

    if is_cluster_url(url):
        nodes, options = parse_cluster_url(url)
        return SyncRedisCluster(
            startup_nodes=[SyncClusterNode(host, port) for host, port in nodes],
            socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            **options,
        )
    return redis_sync.Redis.from_url(
        url, socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S
    )


CLOCK_READS = 3  # TIME round trips per anchoring; the shortest is used


def _time_ms(reply: Any) -> float:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) / 1000


async def anchor_steady_clock(redis: Any) -> bool:
    """Anchor this process's steady clock on Redis's TIME (clock.anchor_steady), the one clock every
    process that compares the deadlines kept in Redis can read. False when it was anchored before."""
    readings = []
    for _ in range(CLOCK_READS):
        sent = elapsed_ns()
        reply = await redis.time()
        readings.append((sent, _time_ms(reply), elapsed_ns()))
    return anchor_steady(readings)


def anchor_steady_clock_sync(redis: Any) -> bool:
    """anchor_steady_clock with a blocking client."""
    readings = []
    for _ in range(CLOCK_READS):
        sent = elapsed_ns()
        reply = redis.time()
        readings.append((sent, _time_ms(reply), elapsed_ns()))
    return anchor_steady(readings)

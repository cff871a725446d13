"""TLS and bearer-token auth against real dispatcher processes: each role refused outside its rights,
plaintext and certificate-less clients refused, a full job round trip and a hand-off between two
supervised processes over TLS with auth, Redis with a password and over TLS, secrets kept out of logs.

Certificates come from a throwaway CA made by the tests (tests/support/certs.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dispatcher.queue import keys
from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.tls import ChannelSecurity
from tests.support.certs import CertificateAuthority
from tests.support.processes import DispatcherProcess
from tests.support.redis_cluster import ClusterNodeServer, cluster_port, find_redis_cli
from tests.support.redis_server import RedisServer
from tests.support.wait import wait_for
from worker_sdk import AsyncClient, Client, JobContext, ShardMap, ShardqError, serve

SHARDS = 8
PRODUCER = "producer-billing-0123456789"
PRODUCER_ALL = "producer-all-0123456789"
WORKER = "worker-billing-0123456789"
ADMIN = "admin-0123456789abcdef"
REDIS_PASSWORD = "redis-pass-0123456789"
SETTINGS = {"processes": 1, "shard_count": SHARDS, "metrics_listen": "", "reconcile_interval_s": 3600}
CODES = grpc.StatusCode


def _tokens_file(path: Path) -> Path:
    hashed = "sha256:" + hashlib.sha256(ADMIN.encode()).hexdigest()
    path.write_text(
        f"{PRODUCER} role=producer types=billing.* name=billing-api\n"
        f"{PRODUCER_ALL} role=producer\n"
        f"{WORKER} role=worker types=billing.* name=billing-workers\n"
        f"{hashed} role=admin name=ops  # only the hash is on disk\n"
    )
    return path


class Secured:
    """A CA, the certificate files, a tokens file, and a started TLS + auth dispatcher."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = CertificateAuthority(root / "pki")
        self.server = self.ca.issue("dispatcher")
        self.tokens = _tokens_file(root / "tokens.txt")

    def env(self, **extra: Any) -> dict[str, Any]:
        """Dispatcher settings for TLS + auth; an extra setting of None leaves that one out."""
        settings = {
            **SETTINGS,
            "tls_cert": self.server.cert,
            "tls_key": self.server.key,
            "tls_ca": self.ca.cert_path,
            "auth_tokens_file": self.tokens,
            **extra,
        }
        return {k: v for k, v in settings.items() if v is not None}

    def security(self, token: str | None = ADMIN, **options: Any) -> ChannelSecurity:
        return ChannelSecurity.resolve(token=token, tls_ca=str(self.ca.cert_path), env={}, **options)

    def client(self, target: str, token: str | None, **options: Any) -> Client:
        return Client(target, timeout=10, token=token, tls_ca=str(self.ca.cert_path), **options)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Secured, DispatcherProcess]]:
    """One TLS + auth dispatcher for the role tests (on a Redis of its own, so no other test's
    FLUSHALL reaches it)."""
    root = tmp_path_factory.mktemp("secured")
    setup = Secured(root)
    redis = RedisServer(root / "redis")
    redis.start()
    proc = DispatcherProcess(
        redis.url, f"sqlite:///{root}/shardq.sqlite3", root, security=setup.security(), **setup.env()
    )
    try:
        proc.start()
        yield setup, proc
    finally:
        proc.kill()
        redis.stop()


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(ShardqError) as caught:
        call()
    return caught.value.code


def _connect(security: ChannelSecurity, target: str, types: list[str]) -> str:
    """Open a worker stream with a hello; the kind of the first message back (or raise)."""
    hello = pb.WorkerMessage(hello=pb.Hello(worker_id="w1", job_types=types, concurrency=1))
    with security.channel(target) as channel:
        responses = pb_grpc.WorkerServiceStub(channel).Connect(
            iter([hello]), metadata=security.metadata, timeout=10
        )
        return str(next(responses).WhichOneof("msg"))


def _connect_code(security: ChannelSecurity, target: str, types: list[str]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        _connect(security, target, types)
    return caught.value.code()


def test_calls_without_a_valid_token_are_unauthenticated_and_health_stays_open(secured):
    setup, proc = secured
    for token in (None, "not-a-known-token-0000"):
        with setup.client(proc.target, token) as client:
            assert _code(lambda c=client: c.enqueue("billing.invoice", {})) is CODES.UNAUTHENTICATED
            assert _code(lambda c=client: c.version()) is CODES.UNAUTHENTICATED
        assert _connect_code(setup.security(token), proc.target, ["billing.x"]) is CODES.UNAUTHENTICATED
    # A scheme other than Bearer is no token.
    with setup.security(None).channel(proc.target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.JobServiceStub(channel).GetVersion(
                pb.GetVersionRequest(), metadata=(("authorization", f"Basic {ADMIN}"),), timeout=5
            )
        assert caught.value.code() is CODES.UNAUTHENTICATED
        # Probes need no token (grpc.health.v1 is open: it only says SERVING or NOT_SERVING).
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_a_producer_enqueues_and_reads_its_own_types_and_nothing_else(secured):
    setup, proc = secured
    with setup.client(proc.target, ADMIN) as admin:
        other = admin.enqueue("email.send", {"to": "a@example.com"})
    with setup.client(proc.target, PRODUCER) as producer:
        job_id = producer.enqueue("billing.invoice", {"n": 1})
        assert producer.enqueue_many([{"type": "billing.refund"}, {"type": "billing.invoice"}])
        assert producer.get_job(job_id).type == "billing.invoice"
        assert {q.type for q in producer.stats()} <= {"billing.invoice", "billing.refund"}
        assert producer.version().shard_count == SHARDS
        # Types outside its scope, as a job or in a batch, and the jobs of such types.
        assert _code(lambda: producer.enqueue("email.send", {})) is CODES.PERMISSION_DENIED
        denied = [{"type": "billing.ok"}, {"type": "resize"}]
        assert _code(lambda: producer.enqueue_many(denied)) is CODES.PERMISSION_DENIED
        assert _code(lambda: producer.get_job(other)) is CODES.NOT_FOUND  # its type is not told
        assert _code(lambda: producer.cancel(other)) is CODES.PERMISSION_DENIED
        # Admin-only and worker-only calls.
        assert _code(lambda: producer.dead_letters()) is CODES.PERMISSION_DENIED
        assert _code(lambda: producer.requeue_dead(all=True)) is CODES.PERMISSION_DENIED
        assert _code(lambda: producer.purge_dead()) is CODES.PERMISSION_DENIED
        assert _code(lambda: producer.rebalance(dry_run=True)) is CODES.PERMISSION_DENIED
        assert _code(lambda: producer.pause_queue("billing.invoice")) is CODES.PERMISSION_DENIED
        assert (
            _code(lambda: producer.set_queue_settings("billing.x", concurrency=1)) is CODES.PERMISSION_DENIED
        )
        assert _code(lambda: producer.list_queues()) is CODES.PERMISSION_DENIED
        assert producer.shard_map().shard_count > 0  # to send jobs to their shard's owner
        assert producer.cancel(job_id) == "cancelled"
    assert _connect_code(setup.security(PRODUCER), proc.target, ["billing.x"]) is CODES.PERMISSION_DENIED
    # PushJobs is for the dispatchers' own hand-offs.
    with setup.security(PRODUCER).channel(proc.target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.ShardServiceStub(channel).PushJobs(
                pb.PushJobsRequest(shard=0), metadata=setup.security(PRODUCER).metadata, timeout=5
            )
        assert caught.value.code() is CODES.PERMISSION_DENIED
    # An unscoped producer may use every type.
    with setup.client(proc.target, PRODUCER_ALL) as producer:
        assert producer.get_job(other).type == "email.send"


def test_a_worker_connects_for_its_types_only_and_cannot_enqueue(secured):
    setup, proc = secured
    worker = setup.security(WORKER)
    assert _connect(worker, proc.target, ["billing.invoice", "billing.refund"]) == "welcome"
    assert _connect_code(worker, proc.target, ["billing.invoice", "resize"]) is CODES.PERMISSION_DENIED
    with setup.client(proc.target, WORKER) as client:
        assert client.shard_map().shard_count == SHARDS
        assert _code(lambda: client.enqueue("billing.invoice", {})) is CODES.PERMISSION_DENIED
        assert _code(lambda: client.stats()) is CODES.PERMISSION_DENIED
        assert _code(lambda: client.dead_letters()) is CODES.PERMISSION_DENIED
        assert _code(lambda: client.rebalance(dry_run=True)) is CODES.PERMISSION_DENIED


def test_admin_may_do_everything(secured):
    setup, proc = secured
    with setup.client(proc.target, ADMIN) as admin:
        job_id = admin.enqueue("resize", {"w": 1})
        assert admin.get_job(job_id).status == "ready"
        assert admin.dead_letters() == []
        assert admin.requeue_dead(all=True) == 0
        assert admin.purge_dead() == 0
        assert admin.rebalance(dry_run=True).applied is False
        assert len(admin.shard_map().shards) == SHARDS
        assert any(q.type == "resize" for q in admin.stats())
        assert admin.set_queue_settings("resize", concurrency=4).settings.concurrency == 4
        assert admin.get_queue("resize").ready >= 1
        assert admin.set_queue_settings("resize", concurrency=0).settings.concurrency == 0
    assert _connect(setup.security(ADMIN), proc.target, ["resize", "billing.x"]) == "welcome"


def test_plaintext_and_untrusted_clients_cannot_talk_to_a_tls_port(secured, tmp_path):
    setup, proc = secured
    with Client(proc.target, timeout=5, token=ADMIN, tls=False) as plain:
        assert _code(plain.version) is CODES.UNAVAILABLE
    stranger = CertificateAuthority(tmp_path / "other-ca", name="another CA")
    with Client(proc.target, timeout=5, token=ADMIN, tls_ca=str(stranger.cert_path)) as untrusting:
        assert _code(untrusting.version) is CODES.UNAVAILABLE
    # The certificate names localhost and 127.0.0.1; another name is a mismatch unless overridden.
    with setup.client(proc.target, ADMIN, tls_server_name="elsewhere.example") as wrong_name:
        assert _code(wrong_name.version) is CODES.UNAVAILABLE
    with setup.client(proc.target, ADMIN, tls_server_name="localhost") as right_name:
        assert right_name.version().shard_count == SHARDS


def test_dispatcherctl_takes_a_token_and_a_ca(secured):
    setup, proc = secured

    def ctl(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        if token:
            env["SHARDQ_TOKEN"] = token  # the env, not argv, for secrets
        argv = [
            sys.executable,
            "-m",
            "dispatcher.cli.ctl",
            "--target",
            proc.target,
            "--tls-ca",
            str(setup.ca.cert_path),
        ]
        return subprocess.run(
            [*argv, *args], env=env, capture_output=True, text=True, timeout=30, check=False
        )

    assert ctl("health").returncode == 0
    denied = ctl("dlq", "list", token=PRODUCER)
    assert denied.returncode == 1 and "permission denied" in denied.stderr, denied.stderr
    assert ctl("dlq", "list", token=ADMIN).returncode == 0
    missing = ctl("stats")
    assert missing.returncode == 1 and "unauthenticated" in missing.stderr, missing.stderr


async def test_a_job_round_trip_with_tls_and_auth_never_unpickles_the_payload(secured, tmp_path):
    setup, proc = secured
    marker = tmp_path / "unpickled"
    # Bytes that would create the marker file if anything called pickle.loads on them.
    payload = pickle.dumps(_Exploit(str(marker)))
    seen: list[bytes] = []

    async def handle(ctx: JobContext) -> dict[str, int]:
        seen.append(ctx.payload)
        return {"bytes": len(ctx.payload)}

    client = AsyncClient(proc.target, token=PRODUCER, tls_ca=str(setup.ca.cert_path))
    try:
        job_id = await client.enqueue("billing.roundtrip", payload)
        async with serve(
            {"billing.roundtrip": handle},
            target=proc.target,
            token=WORKER,
            tls_ca=str(setup.ca.cert_path),
            handle_signals=False,
            concurrency=2,
        ):
            job = await wait_for(
                lambda: _finished(client, job_id), timeout=15, message="the job never succeeded"
            )
        assert job.result == b'{"bytes": %d}' % len(payload)
    finally:
        await client.close()
    assert seen == [payload]
    assert not marker.exists()


async def test_a_worker_outside_its_scope_is_stopped_with_the_refusal(secured):
    setup, proc = secured
    worker = serve(
        {"resize": lambda ctx: None},
        target=proc.target,
        token=WORKER,
        tls_ca=str(setup.ca.cert_path),
        handle_signals=False,
    )
    with pytest.raises(ShardqError) as caught:
        async with asyncio.timeout(15):
            await worker
    assert caught.value.code is CODES.PERMISSION_DENIED and "resize" in caught.value.details


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path, redis_url):
    setup = Secured(tmp_path)
    client_pair = setup.ca.issue("billing-client", server=False)
    with_cert = setup.security(None, tls_cert=str(client_pair.cert), tls_key=str(client_pair.key))
    proc = DispatcherProcess(
        redis_url,
        f"sqlite:///{tmp_path}/shardq.sqlite3",
        tmp_path,
        security=with_cert,
        **{**setup.env(auth_tokens_file=None), "tls_client_ca": setup.ca.cert_path},
    )
    try:
        proc.start()
        certless = setup.client(proc.target, None)
        with certless:
            assert _code(certless.version) is CODES.UNAVAILABLE
        outsider = CertificateAuthority(tmp_path / "other-ca", name="another CA").issue("intruder")
        foreign = setup.client(proc.target, None, tls_cert=str(outsider.cert), tls_key=str(outsider.key))
        with foreign:
            assert _code(foreign.version) is CODES.UNAVAILABLE
        cert_args = {"tls_cert": str(client_pair.cert), "tls_key": str(client_pair.key)}
        with setup.client(proc.target, None, **cert_args) as client:
            job_id = client.enqueue("billing.invoice", {})
            assert client.get_job(job_id).status == "ready"
    finally:
        proc.kill()


async def test_two_supervised_processes_hand_jobs_off_over_tls_with_auth(tmp_path, redis_url):
    setup = Secured(tmp_path)
    admin = setup.security(ADMIN)
    proc = DispatcherProcess(
        redis_url,
        f"sqlite:///{tmp_path}/shardq.sqlite3",
        tmp_path,
        security=admin,
        **setup.env(processes=2, ownership_ttl_ms=3000),  # no SHARDQ_PEER_TOKEN: the supervisor makes one
    )
    try:
        proc.start()
        # Settled, and the same for 2 s: each process re-reads the map every second, and one whose
        # view is older than a move queues nothing for that shard (it flags it for the owner).
        stable = _Stable(setup, proc.target, hold_s=2.0)
        view = await wait_for(stable.check, timeout=30, message="2 processes never settled")
        members = {m.id: m.address for m in view.members}
        owner = {s.shard: s.owner for s in view.shards}
        (first, first_address), (second, _) = sorted(members.items())
        # Types whose shards the second process owns, enqueued at the first process's own port.
        types = [t for t in (f"billing.t{i}" for i in range(200)) if owner[shard_for(t, SHARDS)] == second][
            :3
        ]
        assert types, "the second process owns no shard"
        handled: list[str] = []

        async def handle(ctx: JobContext) -> None:
            handled.append(ctx.job_id)

        # route=False: through the first process, which hands them over (instead of the client
        # sending them to their owner itself).
        client = AsyncClient(first_address, token=PRODUCER, tls_ca=str(setup.ca.cert_path), route=False)
        try:
            ids = [await client.enqueue(t, {"i": i}) for i, t in enumerate(types)]
            # Handed to the owner before enqueue returns, which queues them behind its answer. (A
            # refused hand-off would flag the shard in shardq:dirty for its owner to reconcile.)
            with redis_lib.Redis.from_url(redis_url) as redis:
                for job_id, job_type in zip(ids, types, strict=True):
                    shard = shard_for(job_type, SHARDS)
                    assert not redis.sismember(keys.DIRTY_KEY, shard)
                    await wait_for(lambda: redis.hexists(keys.ShardKeys(shard).jobs, job_id), timeout=5)  # noqa: B023
            # A worker follows the shard map to the owner's advertised port, over TLS too.
            async with serve(
                {t: handle for t in types},
                target=proc.target,
                token=WORKER,
                tls_ca=str(setup.ca.cert_path),
                handle_signals=False,
            ):
                await wait_for(lambda: set(ids) <= set(handled), timeout=20, message="jobs did not run")
        finally:
            await client.close()
        log = proc.log_tail(10_000)
        assert "hand-off to the shard owner failed" not in log
        assert "call refused" not in log
        assert first != second
    finally:
        proc.kill()


def test_redis_with_a_password_and_over_tls_and_no_secret_in_the_logs(tmp_path):
    setup = Secured(tmp_path)
    tls_port = _free_port()
    redis = _PasswordRedis(
        tmp_path / "redis",
        extra_args=(
            "--requirepass", REDIS_PASSWORD,
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(setup.server.cert),
            "--tls-key-file", str(setup.server.key),
            "--tls-ca-cert-file", str(setup.ca.cert_path),
            "--tls-auth-clients", "no",
        ),
    )  # fmt: skip
    redis.start()
    try:
        plain_url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0"
        tls_url = f"rediss://:{REDIS_PASSWORD}@127.0.0.1:{tls_port}/0?ssl_ca_certs={setup.ca.cert_path}"
        for url in (plain_url, tls_url):
            proc = DispatcherProcess(
                url,
                f"sqlite:///{tmp_path}/shardq.sqlite3",
                tmp_path,
                security=setup.security(ADMIN),
                **setup.env(log_level="debug"),
            )
            try:
                proc.start()
                with setup.client(proc.target, PRODUCER) as client:
                    job_id = client.enqueue("billing.invoice", {})
                    assert client.get_job(job_id).status == "ready"
                    assert _code(lambda c=client: c.dead_letters()) is CODES.PERMISSION_DENIED
            finally:
                proc.stop()
            log = proc.log_tail(10_000)
            assert "using redis" in log and ":***@127.0.0.1" in log
            for secret in (REDIS_PASSWORD, PRODUCER, ADMIN, WORKER):
                assert secret not in log, f"a secret reached the log of the dispatcher on {url.split(':')[0]}"
        with redis.client() as direct:
            assert direct.dbsize() > 0
        # Without the password Redis refuses the dispatcher, and the error names no password.
        proc = DispatcherProcess(
            f"redis://:wrong-{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0",
            f"sqlite:///{tmp_path}/other.sqlite3",
            tmp_path,
            **SETTINGS,
        )
        with pytest.raises(RuntimeError) as caught:
            proc.start(timeout=20)
        assert REDIS_PASSWORD not in str(caught.value)
    finally:
        redis.stop()


def test_a_redis_cluster_over_tls(tmp_path):
    """rediss+cluster://: the seeds and every master are reached over TLS (the nodes tell TLS
    clients their TLS ports); the cluster bus is TLS too."""
    setup = Secured(tmp_path)
    tls_args = (
        "--tls-cert-file", str(setup.server.cert),
        "--tls-key-file", str(setup.server.key),
        "--tls-ca-cert-file", str(setup.ca.cert_path),
        "--tls-auth-clients", "no",
        "--tls-cluster", "yes",
    )  # fmt: skip
    nodes: list[ClusterNodeServer] = []
    tls_ports: list[int] = []
    try:
        for _ in range(3):
            # With --tls-cluster the bus listens 10000 above the TLS port: that pair must be free too.
            taken = tls_ports + [n.port for n in nodes]
            tls_ports.append(_cluster_port(taken))
            node = ClusterNodeServer(
                tmp_path / "cluster",
                port=_cluster_port([*taken, tls_ports[-1]]),
                extra_args=("--tls-port", str(tls_ports[-1]), *tls_args),
            )
            node.start()
            nodes.append(node)
        created = subprocess.run(
            [find_redis_cli(nodes[0].binary), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert created.returncode == 0, created.stdout + created.stderr
        seeds = ",".join(f"127.0.0.1:{p}" for p in tls_ports)
        url = f"rediss+cluster://{seeds}?ssl_ca_certs={setup.ca.cert_path}"
        proc = DispatcherProcess(
            url,
            f"sqlite:///{tmp_path}/shardq.sqlite3",
            tmp_path,
            security=setup.security(ADMIN),
            **setup.env(),
        )
        try:
            proc.start(timeout=40)  # waits for cluster_state:ok through the dispatcher's own start
            with setup.client(proc.target, ADMIN) as client:
                ids = client.enqueue_many([{"type": f"billing.c{i}"} for i in range(8)])
                assert {client.get_job(i).status for i in ids} == {"ready"}
        finally:
            proc.kill()
        # The jobs are spread over the masters, each reached over TLS.
        holding = 0
        for node in nodes:
            with node.client() as direct:
                holding += direct.dbsize() > 0
        assert holding >= 2
    finally:
        for node in nodes:
            node.stop()


def test_a_malformed_tokens_file_stops_the_start_with_a_clear_message(tmp_path, redis_url):
    bad = tmp_path / "tokens.txt"
    bad.write_text(f"{ADMIN} role=superuser\n")
    proc = DispatcherProcess(
        redis_url, f"sqlite:///{tmp_path}/db.sqlite3", tmp_path, auth_tokens_file=bad, **SETTINGS
    )
    with pytest.raises(RuntimeError, match=r"line 1: unknown role 'superuser'") as caught:
        proc.start()
    assert ADMIN not in str(caught.value)
    assert proc.process is not None and proc.process.returncode == 2


# -- helpers -------------------------------------------------------------------------------------


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


class _PasswordRedis(RedisServer):
    def client(self, **kwargs: Any) -> Any:
        kwargs.setdefault("password", REDIS_PASSWORD)
        return super().client(**kwargs)


def _cluster_port(taken: list[int]) -> int:
    """A free port P (and P + 10000, for the cluster bus) not among ``taken`` (chosen, not yet bound)."""
    return next(p for p in iter(cluster_port, None) if p not in taken)


def _free_port() -> int:
    from tests.support.ports import free_port

    return free_port()


async def _finished(client: AsyncClient, job_id: str) -> Any:
    job = await client.get_job(job_id)
    return job if job.status == "succeeded" else None


class _Stable:
    """The shard map once it has been settled and unchanged for ``hold_s``."""

    def __init__(self, setup: Secured, target: str, hold_s: float) -> None:
        self.setup, self.target, self.hold_s = setup, target, hold_s
        self.owners: dict[int, str] | None = None
        self.since = 0.0

    def check(self) -> ShardMap | None:
        view = _settled(self.setup, self.target)
        owners = {s.shard: s.owner for s in view.shards} if view is not None else None
        now = time.monotonic()
        if owners is None or owners != self.owners:
            self.owners, self.since = owners, now
            return None
        return view if now - self.since >= self.hold_s else None


def _settled(setup: Secured, target: str) -> ShardMap | None:
    try:
        with setup.client(target, ADMIN) as client:
            view = client.shard_map()
    except ShardqError:
        return None
    alive = {m.id for m in view.members if m.alive}
    return view if len(alive) == 2 and all(s.owner in alive for s in view.shards) else None

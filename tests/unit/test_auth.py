"""Tokens file parsing, token checks, the method -> role table, type scopes, and secret redaction."""

from __future__ import annotations

import hashlib

import pytest

from dispatcher.api import auth
from dispatcher.api.auth import ADMIN, PEER, PRODUCER, WORKER, Principal, TokenTable
from dispatcher.config import Settings
from shardq_common.errors import ConfigError, PermissionDenied
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.redaction import SecretFilter, redact

PRODUCER_TOKEN = "producer-token-0123456789"
WORKER_TOKEN = "worker-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789"


def _sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


FILE = f"""
# producers
{_sha(PRODUCER_TOKEN)}  role=producer  types=billing.*,email.send  name=billing-api
{WORKER_TOKEN} role=worker types=resize
{_sha(ADMIN_TOKEN)} role=admin   # ops
"""


def test_a_tokens_file_maps_tokens_to_roles_and_scopes():
    table = TokenTable.parse(FILE, "tokens.txt")
    assert len(table) == 3
    producer = table.authenticate(PRODUCER_TOKEN)
    assert producer == Principal("billing-api", PRODUCER, ("billing.*", "email.send"))
    assert table.authenticate(WORKER_TOKEN) == Principal("worker@line4", WORKER, ("resize",))
    assert table.authenticate(ADMIN_TOKEN).role is ADMIN
    assert table.authenticate("not-a-token-at-all-000") is None
    assert table.authenticate(PRODUCER_TOKEN[:-1]) is None
    assert table.roles() == {"producer": 1, "worker": 1, "admin": 1}


def test_inline_tokens_take_semicolons_and_the_peer_token_is_its_own_role():
    table = TokenTable.load(
        None, f"{ADMIN_TOKEN} role=admin; {WORKER_TOKEN} role=worker", "peer-secret-0123456789"
    )
    assert table is not None and len(table) == 3
    assert table.authenticate("peer-secret-0123456789") == Principal("peer", PEER)
    assert TokenTable.load(None, None) is None  # nothing configured: auth is off


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("short role=admin", "at least 16 characters"),
        ("sha256:abcd role=admin", "64 hex digits"),
        (f"{ADMIN_TOKEN}", "role= is required"),
        (f"{ADMIN_TOKEN} role=root", "unknown role 'root'"),
        (f"{ADMIN_TOKEN} role=admin types=a.*", "admin token has no type scope"),
        (f"{ADMIN_TOKEN} role=producer types=a;b", "bad job-type pattern"),
        (f"{ADMIN_TOKEN} role=producer scope=x", "expected role="),
        (f"{ADMIN_TOKEN} role=producer role=worker", "role= given twice"),
        (
            f"{ADMIN_TOKEN} role=admin\n{_sha(ADMIN_TOKEN)} role=producer",
            "line 2: the same token is listed twice",
        ),
        ("# only a comment\n", "no tokens"),
    ],
)
def test_a_malformed_tokens_file_is_refused_without_echoing_a_token(tmp_path, text, message):
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        TokenTable.load(str(path), None)
    assert ADMIN_TOKEN not in str(caught.value)


def test_missing_tokens_file_and_conflicting_settings():
    with pytest.raises(ConfigError, match="cannot read the tokens file"):
        TokenTable.load("/nonexistent/tokens.txt", None)
    with pytest.raises(ConfigError, match="not both"):
        TokenTable.load("tokens.txt", "x")
    with pytest.raises(ConfigError, match="give peers their own"):
        TokenTable.load(None, f"{ADMIN_TOKEN} role=admin", ADMIN_TOKEN)
    with pytest.raises(ConfigError, match="SHARDQ_TLS_KEY"):
        Settings(tls_cert="cert.pem")
    with pytest.raises(ConfigError, match="mutual TLS"):
        Settings(tls_client_ca="ca.pem")


def test_every_rpc_of_the_proto_has_a_line_in_the_table():
    """A new RPC must be given its roles on purpose (unlisted ones are refused to everyone)."""
    methods = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods <= set(auth.METHOD_ROLES), methods - set(auth.METHOD_ROLES)


def test_roles_and_unknown_methods():
    producer, worker = Principal("p", PRODUCER), Principal("w", WORKER)
    admin, peer = Principal("a", ADMIN), Principal("x", PEER)
    assert producer.may_call("/shardq.v1.JobService/Enqueue")
    assert not producer.may_call("/shardq.v1.JobService/ListDead")
    assert not producer.may_call("/shardq.v1.WorkerService/Connect")
    assert not producer.may_call("/shardq.v1.ShardService/PushJobs")
    assert producer.may_call("/shardq.v1.ShardService/GetShardMap")  # to send jobs to their owner
    assert worker.may_call("/shardq.v1.WorkerService/Connect")
    assert worker.may_call("/shardq.v1.ShardService/GetShardMap")
    assert not worker.may_call("/shardq.v1.JobService/Enqueue")
    assert peer.may_call("/shardq.v1.ShardService/PushJobs")
    assert not peer.may_call("/shardq.v1.JobService/Enqueue")
    for method in auth.METHOD_ROLES:
        assert admin.may_call(method)
    assert admin.may_call("/shardq.v1.ScheduleService/UpsertSchedule")
    assert not producer.may_call("/shardq.v1.ScheduleService/ListSchedules")
    # Not in the table: refused even to admin. Health and reflection are open to all.
    assert not admin.may_call("/shardq.v1.JobService/DropEverything")
    assert auth.is_open("/grpc.health.v1.Health/Check")
    assert not auth.is_open("/shardq.v1.JobService/GetVersion")


def test_type_scopes_match_whole_types():
    billing = Principal("b", PRODUCER, ("billing.*", "email.send"))
    assert billing.may_use("billing.invoice") and billing.may_use("email.send")
    assert not billing.may_use("email.sender") and not billing.may_use("xbilling.invoice")
    with pytest.raises(PermissionDenied, match="'resize' is outside the scope of token 'b'"):
        billing.check_types(["billing.x", "resize"], "hello.job_types")
    assert Principal("any", WORKER).may_use("anything")
    unscoped = TokenTable.parse(f"{WORKER_TOKEN} role=worker types=*", "t").authenticate(WORKER_TOKEN)
    assert unscoped is not None and unscoped.types == ()


def test_redaction_of_urls_options_and_tokens():
    assert redact("connecting to rediss://:hunter2@cache:6380/0 failed") == (
        "connecting to rediss://:***@cache:6380/0 failed"
    )
    assert redact("postgresql://db/jobs?sslmode=require&password=hunter2") == (
        "postgresql://db/jobs?sslmode=require&password=***"
    )
    assert redact("authorization: Bearer abc.def") == "authorization: Bearer ***"
    secrets = SecretFilter()
    secrets.add("tok-0123456789abcdef")
    secrets.add("short")  # too short to mask safely: left alone
    assert secrets("token tok-0123456789abcdef was short") == "token *** was short"
    assert "tok-0123456789" not in repr(Settings(auth_tokens="tok-0123456789abcdef role=admin"))

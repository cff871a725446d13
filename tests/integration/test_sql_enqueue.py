"""The SQL enqueue functions of migrations 0008 and 0010 against a real PostgreSQL (shardq_enqueue_v1,
shardq_enqueue_many_v1; shardq_enqueue_v2, shardq_enqueue_many_v2 with a concurrency key and headers):
the rows are the dispatcher's (id format, shard, status, defaults), bad input gets
the RPC's message for the same field and inserts nothing, idempotency keys hold, a notification is
delivered at the commit and never for a rollback; the SDK's helpers on each kind of connection; and
the reconciler, finding such a job not pushed yet, notes it rather than reporting it lost."""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import redis.asyncio as aredis
from psycopg.types.json import Jsonb
from structlog.testing import capture_logs

from dispatcher.config import Settings
from dispatcher.queue import validation
from dispatcher.queue.ids import time_of
from dispatcher.queue.reconciler import Reconciler
from dispatcher.queue.status_writer import StatusWriter
from dispatcher.queue.working_set import WorkingSet
from dispatcher.store import Store, open_store
from shardmap import shard_for
from shardq_common.clock import wall_ms
from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb
from worker_sdk import (
    InvalidArgumentError,
    enqueue_in_transaction,
    enqueue_in_transaction_async,
    enqueue_many_in_transaction,
    enqueue_many_in_transaction_async,
)

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
SHARD_COUNT = 16
SETTINGS = Settings(shard_count=SHARD_COUNT, max_batch=50)
ID_PATTERN = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
CENTURY_MS = validation.MAX_HORIZON_MS


async def _prepared(db_url: str) -> Store:
    """A database as a dispatcher leaves it at its start: migrated, shard count and limits recorded."""
    store = await open_store(db_url)
    await store.migrate()
    await store.ensure_shard_count(SHARD_COUNT)
    await store.record_enqueue_settings(
        {
            "max_payload_bytes": SETTINGS.max_payload_bytes,
            "max_attempts": SETTINGS.max_attempts,
            "lease_ttl_ms": SETTINGS.lease_ttl_ms,
            "max_batch": SETTINGS.max_batch,
        }
    )
    return store


@pytest.fixture(autouse=True)
def _untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helpers add a trace context to the headers once a tracer provider is set, which another
    module of the session may do (once a process): here the rows and messages are compared with the
    RPC's for the headers given. The trace context is tests/e2e/test_transactional_enqueue.py's."""
    from worker_sdk import _tracing

    monkeypatch.setattr(_tracing, "_provider_set", lambda: False)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    store = await _prepared(db_url)
    yield store
    await store.close()


@pytest.fixture
def conn(store: Store, db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url) as connection:
        yield connection


def _count(db_url: str, table: str) -> int:
    with psycopg.connect(db_url) as c:
        return int(c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # type: ignore[index]


# (SQL arguments, the same job as the RPC's JobSpec fields): each bad in one field.
BAD_JOBS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"job_type": ""}, {"type": ""}),
    ({"job_type": "bad type"}, {"type": "bad type"}),
    ({"job_type": "-leading"}, {"type": "-leading"}),
    ({"job_type": "é"}, {"type": "é"}),
    ({"job_type": "x" * 201}, {"type": "x" * 201}),
    ({"payload": b"x" * ((1 << 20) + 1)}, {"payload": b"x" * ((1 << 20) + 1)}),
    ({"run_at_ms": 5_000, "delay_ms": 5}, {"run_at_ms": 5_000, "delay_ms": 5}),
    ({"delay_ms": -1}, {"delay_ms": -1}),
    ({"delay_ms": CENTURY_MS + 1}, {"delay_ms": CENTURY_MS + 1}),
    ({"run_at_ms": 0}, {"run_at_ms": 0}),
    ({"run_at_ms": -5}, {"run_at_ms": -5}),
    ({"run_at_ms": 2 * CENTURY_MS}, {"run_at_ms": 2 * CENTURY_MS}),
    ({"max_attempts": 0}, {"max_attempts": 0}),
    ({"max_attempts": 1001}, {"max_attempts": 1001}),
    ({"lease_ttl_ms": 99}, {"lease_ttl_ms": 99}),
    ({"lease_ttl_ms": 24 * 3600 * 1000 + 1}, {"lease_ttl_ms": 24 * 3600 * 1000 + 1}),
    ({"idempotency_key": "k" * 201}, {"idempotency_key": "k" * 201}),
    ({"idempotency_key": "tab\there"}, {"idempotency_key": "tab\there"}),
    ({"idempotency_key": "zero\u200bwidth"}, {"idempotency_key": "zero\u200bwidth"}),
    ({"idempotency_key": "no\u00a0break"}, {"idempotency_key": "no\u00a0break"}),
]


def _rpc_message(spec_fields: dict[str, Any], field: str) -> str:
    spec = pb.JobSpec(**{"type": "noop.ok", "payload": b"{}", **spec_fields})
    with pytest.raises(InvalidArgument) as caught:
        validation.job_spec(spec, field, SETTINGS, wall_ms())
    return str(caught.value)


def _sql_args(fields: dict[str, Any]) -> dict[str, Any]:
    return {"job_type": "noop.ok", "payload": b"{}", **fields}


@pytest.mark.parametrize(("sql_fields", "spec_fields"), BAD_JOBS, ids=[repr(b[0])[:40] for b in BAD_JOBS])
def test_bad_input_gets_the_rpcs_message_and_inserts_nothing(
    conn: psycopg.Connection[Any], db_url: str, sql_fields: dict[str, Any], spec_fields: dict[str, Any]
) -> None:
    args = _sql_args(sql_fields)
    names = ", ".join(f"{k} => %({k})s" for k in args)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT shardq_enqueue_v1({names})", args)
    assert caught.value.diag.message_primary == _rpc_message(spec_fields, "job")
    conn.rollback()
    # The batch form names the job by its index, as EnqueueMany does.
    with pytest.raises(InvalidArgumentError) as caught_many:
        enqueue_many_in_transaction(conn, [pb.JobSpec(type="noop.ok"), _sdk_job(args)])
    assert caught_many.value.details == _rpc_message(spec_fields, "jobs[1]")
    assert caught_many.value.code.name == "INVALID_ARGUMENT"
    conn.rollback()
    assert _count(db_url, "jobs") == 0 and _count(db_url, "jobs_to_push") == 0


def _sdk_job(args: dict[str, Any]) -> pb.JobSpec:
    spec = pb.JobSpec(type=args["job_type"], payload=args["payload"])
    for key in ("run_at_ms", "delay_ms", "max_attempts", "lease_ttl_ms", "idempotency_key"):
        if key in args:
            setattr(spec, key, args[key])
    return spec


def test_an_unknown_priority_and_batch_limits_are_refused_naming_the_field(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match=r"^job\.priority: unknown priority 'urgent'"
    ):
        conn.execute("SELECT shardq_enqueue_v1('noop.ok', '', priority => 'urgent')")
    conn.rollback()
    with pytest.raises(ValueError, match="unknown priority"):  # the SDK refuses it first, as Client does
        enqueue_in_transaction(conn, "noop.ok", priority="urgent")
    with pytest.raises(InvalidArgumentError, match="jobs: the batch is empty"):
        enqueue_many_in_transaction(conn, [])
    conn.rollback()
    with pytest.raises(InvalidArgumentError, match="jobs: 51 jobs is over the batch limit of 50"):
        enqueue_many_in_transaction(conn, [{"type": "noop.ok"}] * 51)
    conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="every array must have one entry per job"):
        conn.execute("SELECT shardq_enqueue_many_v1(ARRAY['a', 'b'], ARRAY['x'::bytea])")
    conn.rollback()
    assert _count(db_url, "jobs") == 0


def test_rows_are_made_as_the_dispatchers_enqueue_makes_them(conn: psycopg.Connection[Any]) -> None:
    before = wall_ms()
    plain = enqueue_in_transaction(conn, "email.send", {"to": "a@example.com"})
    delayed = enqueue_in_transaction(
        conn,
        "report.build",
        b"raw",
        priority="high",
        delay=30,
        max_attempts=9,
        lease_ttl=5,
        idempotency_key="r1",
    )
    batch = enqueue_many_in_transaction(
        conn, [{"type": f"t{i}", "payload": {"i": i}, "priority": "low", "run_at": 1.5} for i in range(20)]
    )
    conn.commit()
    after = wall_ms()
    rows = {
        r[0]: r
        for r in conn.execute(
            "SELECT id, type, shard, priority, payload, status, run_at, max_attempts, lease_ttl_ms, "
            "idem_key, enqueued_at, updated_at, attempts, failures, expirations FROM jobs"
        )
    }
    assert len(rows) == 22
    for job_id, (_, job_type, shard, *_rest) in rows.items():
        assert ID_PATTERN.fullmatch(job_id), job_id
        assert shard == shard_for(job_type, SHARD_COUNT)
        assert before <= time_of(job_id) <= after
    _, _, _, prio, payload, status, run_at, attempts, ttl, key, enqueued, updated, *counters = rows[plain]
    assert (prio, bytes(payload), status, attempts, ttl, key) == (
        1, b'{"to":"a@example.com"}', "ready", SETTINGS.max_attempts, SETTINGS.lease_ttl_ms, None,
    )  # fmt: skip
    assert run_at == enqueued == updated == time_of(plain) and counters == [0, 0, 0]
    _, _, _, prio, payload, status, run_at, attempts, ttl, key, enqueued, *_ = rows[delayed]
    assert (prio, bytes(payload), status, attempts, ttl, key) == (0, b"raw", "delayed", 9, 5000, "r1")
    assert run_at == enqueued + 30_000
    assert {rows[i][3] for i in batch} == {2} and {rows[i][6] for i in batch} == {1500}
    assert {rows[i][5] for i in batch} == {"ready"}  # due long ago
    assert len({i[:10] for i in batch}) == 1  # a batch's ids share their millisecond, as new_job_ids's do
    noted = dict(conn.execute("SELECT id, shard FROM jobs_to_push").fetchall())
    assert noted == {job_id: row[2] for job_id, row in rows.items()}


def test_an_idempotency_key_returns_the_job_that_holds_it_in_its_type(conn: psycopg.Connection[Any]) -> None:
    first = enqueue_in_transaction(conn, "mail.send", {}, idempotency_key="order-1")
    conn.commit()
    again = enqueue_in_transaction(conn, "mail.send", {"other": 1}, idempotency_key="order-1")
    other_type = enqueue_in_transaction(conn, "sms.send", {}, idempotency_key="order-1")
    batch = enqueue_many_in_transaction(
        conn,
        [
            {"type": "mail.send", "idempotency_key": "order-1"},
            {"type": "mail.send", "idempotency_key": "order-2"},
            {"type": "mail.send", "idempotency_key": "order-2"},
            {"type": "mail.send"},
        ],
    )
    conn.commit()
    assert again == first and other_type != first
    assert batch[0] == first and batch[1] == batch[2] and len(set(batch)) == 3
    assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone() == (4,)
    assert conn.execute("SELECT COUNT(*) FROM jobs_to_push").fetchone() == (4,)


def test_a_notification_is_delivered_at_the_commit_and_never_for_a_rollback(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shardq_enqueued")
        enqueue_many_in_transaction(conn, [{"type": "a.one"}, {"type": "a.one"}, {"type": "b.two"}])
        assert list(listener.notifies(timeout=0.3)) == []  # not before the commit
        conn.commit()
        heard = [n.payload for n in listener.notifies(timeout=1.0, stop_after=2)]
        expected = {str(shard_for("a.one", SHARD_COUNT)), str(shard_for("b.two", SHARD_COUNT))}
        assert set(heard) == expected
        enqueue_in_transaction(conn, "a.one")
        conn.rollback()
        assert list(listener.notifies(timeout=0.5)) == []
    assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone() == (3,)


def test_the_sdk_helpers_work_on_psycopg_and_sqlalchemy_sync_connections(store: Store, db_url: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session, session.begin():
            in_session = enqueue_in_transaction(session, "orm.session", {"n": 1}, delay=60)
            many_in_session = enqueue_many_in_transaction(session, [{"type": "orm.session"}] * 3)
        with engine.begin() as connection:
            in_connection = enqueue_in_transaction(connection, "orm.connection")
        with engine.connect() as connection:
            enqueue_in_transaction(connection, "orm.rolled_back")
            connection.rollback()
            with pytest.raises(InvalidArgumentError, match=r"job\.max_attempts: must be in 1\.\.1000"):
                enqueue_in_transaction(connection, "orm.bad", max_attempts=5000)
    finally:
        engine.dispose()
    with psycopg.connect(db_url) as conn, conn.cursor() as cursor:
        on_cursor = enqueue_in_transaction(cursor, "psycopg.cursor")
        conn.commit()
        types = dict(conn.execute("SELECT id, type FROM jobs").fetchall())
    assert types == {
        in_session: "orm.session",
        **{i: "orm.session" for i in many_in_session},
        in_connection: "orm.connection",
        on_cursor: "psycopg.cursor",
    }


async def test_the_sdk_helpers_work_on_async_connections(store: Store, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        one = await enqueue_in_transaction_async(conn, "async.psycopg", {"a": 1})
        many = await enqueue_many_in_transaction_async(conn, [{"type": "async.psycopg"}] * 2)
        with pytest.raises(TypeError, match="asynchronous"):
            enqueue_in_transaction(conn, "async.psycopg")
        await conn.commit()
    sqlalchemy_async = pytest.importorskip("sqlalchemy.ext.asyncio")
    engine = sqlalchemy_async.create_async_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with sqlalchemy_async.AsyncSession(engine) as session, session.begin():
            in_session = await enqueue_in_transaction_async(session, "async.orm")
    finally:
        await engine.dispose()
    rows = {r.id: r.type for r in await store.get_jobs([one, *many, in_session])}
    assert rows == {
        one: "async.psycopg",
        many[0]: "async.psycopg",
        many[1]: "async.psycopg",
        in_session: "async.orm",
    }


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_the_reconciler_notes_a_job_not_pushed_yet_instead_of_reporting_it_lost(
    store: Store, db_url: str, redis_client: Any
) -> None:
    """The owner was down at the commit and for longer than a push is given to land: the reconcile on
    acquisition finds the job missing from Redis. It is restored as a job whose push was pending."""
    with psycopg.connect(db_url) as conn:
        job_id = enqueue_in_transaction(conn, "noop.late")
        conn.execute("UPDATE jobs SET enqueued_at = enqueued_at - 60000")
        conn.commit()
    shard = shard_for("noop.late", SHARD_COUNT)
    working_set = WorkingSet(redis_client)
    now = wall_ms()
    assert await working_set.acquire(shard, 1, "owner", now, now + 60_000) in (0, 1)
    writer = StatusWriter(store, working_set, flush_interval_ms=10)
    writer.start()
    try:
        with capture_logs() as logs:
            assert await Reconciler(store, working_set, writer).reconcile(shard, 1) == 1
    finally:
        await writer.stop()
    assert (await working_set.record(shard, job_id)) is not None
    events = {e["event"]: e for e in logs}
    assert "restored jobs missing from Redis" not in events
    assert events["restored committed jobs whose push had failed"]["restored"] == 1


def test_a_producer_role_needs_execute_on_the_functions_and_nothing_on_the_tables(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """The grants docs/operations.md gives a producer: CONNECT, USAGE on the schema, EXECUTE on the
    versioned functions. The tables and the internal function stay out of its reach."""
    role = f"shardq_producer_{uuid.uuid4().hex[:8]}"
    database = db_url.rsplit("/", 1)[1]
    conn.autocommit = True
    conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'producer'")
    try:
        conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO {role}')
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(
            "GRANT EXECUTE ON FUNCTION shardq_enqueue_v2, shardq_enqueue_many_v2, shardq_enqueue_v1, "
            f"shardq_enqueue_many_v1 TO {role}"
        )
        producer_url = psycopg.conninfo.make_conninfo(db_url, user=role, password="producer")
        with psycopg.connect(producer_url) as producer:
            job_id = enqueue_in_transaction(producer, "granted.job", {"ok": True}, headers={"a": "b"})
            many = enqueue_many_in_transaction(producer, [{"type": "granted.job"}] * 2)
            [(by_v1,)] = producer.execute("SELECT shardq_enqueue_v1('granted.job', '')")
            producer.commit()
            for statement in (
                "SELECT COUNT(*) FROM jobs",
                "INSERT INTO jobs_to_push VALUES ('x', 0)",
                "UPDATE cluster_meta SET value = '1'",
                "SELECT shardq_enqueue_rows(false, ARRAY['a'], " + ", ".join(["NULL"] * 9) + ")",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    producer.execute(statement)
                producer.rollback()
        owners = dict(conn.execute("SELECT id, type FROM jobs").fetchall())
        assert owners == {
            job_id: "granted.job",
            many[0]: "granted.job",
            many[1]: "granted.job",
            by_v1: "granted.job",
        }
    finally:
        conn.execute(f'REVOKE ALL ON DATABASE "{database}" FROM {role}')
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_the_sdk_helpers_work_on_a_django_cursor(store: Store, db_url: str) -> None:
    """Django's connection, as the README shows it: a DB-API cursor inside transaction.atomic()."""
    django = pytest.importorskip("django")
    from django.conf import settings

    parts = urlsplit(db_url)
    if not settings.configured:
        settings.configure(USE_TZ=True, DATABASES={"default": {"ENGINE": "django.db.backends.postgresql"}})
        django.setup()
    from django.db import connection, transaction

    connection.settings_dict.update(
        NAME=parts.path[1:], USER=parts.username, PASSWORD=parts.password or "", HOST=parts.hostname,
        PORT=str(parts.port or 5432),
    )  # fmt: skip
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            job_id = enqueue_in_transaction(cursor, "django.job", {"a": 1})
            batch = enqueue_many_in_transaction(cursor, [{"type": "django.job"}] * 2)
        with pytest.raises(InvalidArgumentError, match=r"job\.type: must not be empty"):
            with transaction.atomic(), connection.cursor() as cursor:
                enqueue_in_transaction(cursor, "")
        with pytest.raises(RuntimeError), transaction.atomic(), connection.cursor() as cursor:
            enqueue_in_transaction(cursor, "django.rolled_back")
            raise RuntimeError("the view failed after the enqueue")
    finally:
        connection.close()
    with psycopg.connect(db_url) as conn:
        types = dict(conn.execute("SELECT id, type FROM jobs").fetchall())
    assert types == {job_id: "django.job", batch[0]: "django.job", batch[1]: "django.job"}


# Version 2's fields, each bad in one way: (SQL arguments, the same job as the RPC's JobSpec fields).
BAD_V2_JOBS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"concurrency_key": "k" * 129}, {"concurrency_key": "k" * 129}),
    ({"concurrency_key": "tab\there"}, {"concurrency_key": "tab\there"}),
    ({"concurrency_key": "private\ue000use"}, {"concurrency_key": "private\ue000use"}),
    ({"headers": {f"h{i}": "x" for i in range(17)}}, {"headers": {f"h{i}": "x" for i in range(17)}}),
    ({"headers": {"bad name": "x"}}, {"headers": {"bad name": "x"}}),
    ({"headers": {"it's": "x"}}, {"headers": {"it's": "x"}}),
    ({"headers": {"both'\"": "x"}}, {"headers": {"both'\"": "x"}}),
    ({"headers": {"ctl\x07\u2028\U000e0001\\": "x"}}, {"headers": {"ctl\x07\u2028\U000e0001\\": "x"}}),
    ({"headers": {"_leading": "x"}}, {"headers": {"_leading": "x"}}),
    ({"headers": {"n" * 65: "x"}}, {"headers": {"n" * 65: "x"}}),
    ({"headers": {"big": "é" * 1025}}, {"headers": {"big": "é" * 1025}}),
    ({"headers": {"note": "line\nbreak"}}, {"headers": {"note": "line\nbreak"}}),
    ({"headers": {"note": "soft\u00adhyphen"}}, {"headers": {"note": "soft\u00adhyphen"}}),
    (
        {"headers": {f"h{i}": "é" * 500 for i in range(5)}},
        {"headers": {f"h{i}": "é" * 500 for i in range(5)}},
    ),
]


@pytest.mark.parametrize(
    ("sql_fields", "spec_fields"), BAD_V2_JOBS, ids=[repr(b[0])[:40] for b in BAD_V2_JOBS]
)
def test_a_bad_concurrency_key_or_header_gets_the_rpcs_message_and_inserts_nothing(
    conn: psycopg.Connection[Any], db_url: str, sql_fields: dict[str, Any], spec_fields: dict[str, Any]
) -> None:
    args = _sql_args(sql_fields)
    if "headers" in args:
        args["headers"] = Jsonb(args["headers"])
    names = ", ".join(f"{k} => %({k})s" for k in args)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT shardq_enqueue_v2({names})", args)
    assert caught.value.diag.message_primary == _rpc_message(spec_fields, "job")
    conn.rollback()
    with pytest.raises(InvalidArgumentError) as caught_many:
        enqueue_many_in_transaction(conn, [{"type": "noop.ok"}, {"type": "noop.ok", **spec_fields}])
    assert caught_many.value.details == _rpc_message(spec_fields, "jobs[1]")
    conn.rollback()
    assert _count(db_url, "jobs") == 0 and _count(db_url, "jobs_to_push") == 0


def test_headers_that_are_not_an_object_of_strings_are_refused(conn: psycopg.Connection[Any]) -> None:
    for headers, message in [
        ('["a"]', "job.headers: must be a JSON object of strings"),
        ('"a"', "job.headers: must be a JSON object of strings"),
        ('{"n": 1}', "job.headers['n']: must be a string"),
        ('{"n": null}', "job.headers['n']: must be a string"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SELECT shardq_enqueue_v2('noop.ok', '', headers => %s::jsonb)", (headers,))
        assert caught.value.diag.message_primary == message
        conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^jobs\[1\]\.headers\['n'\]: must be"):
        conn.execute(
            "SELECT shardq_enqueue_many_v2(ARRAY['a', 'b'], NULL, "
            "headers => ARRAY[NULL, '{\"n\": 2}']::jsonb[])"
        )
    conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="every array must have one entry per job"):
        conn.execute("SELECT shardq_enqueue_many_v2(ARRAY['a', 'b'], NULL, concurrency_keys => ARRAY['k'])")
    conn.rollback()


def test_version_2_keeps_the_key_and_headers_as_the_rpcs_rows_do(conn: psycopg.Connection[Any]) -> None:
    headers = {"zeta": "last", "Alpha": "first", "a.b-c_d": 'quote " and \\ and é and 😀'}
    keyed = enqueue_in_transaction(conn, "flow.job", {}, concurrency_key="tenant é 1", headers=headers)
    plain = enqueue_in_transaction(conn, "flow.job", {}, concurrency_key="", headers={})
    [(by_sql,)] = conn.execute(
        'SELECT shardq_enqueue_v2(\'flow.job\', \'\', headers => \'{"k": "v", "b": "w"}\'::jsonb, '
        "concurrency_key => 'c')"
    ).fetchall()
    batch = enqueue_many_in_transaction(
        conn, [{"type": "flow.job", "concurrency_key": "k1"}, {"type": "flow.job", "headers": {"h": "1"}}]
    )
    conn.commit()
    rows = dict(
        (r[0], r[1:]) for r in conn.execute("SELECT id, concurrency_key, headers FROM jobs").fetchall()
    )
    assert rows[keyed] == ("tenant é 1", validation.job_headers(headers, "job.headers"))
    assert rows[plain] == (None, None)  # as the RPC stores a job without either
    assert rows[by_sql] == ("c", '{"b":"w","k":"v"}')
    assert rows[batch[0]] == ("k1", None) and rows[batch[1]] == (None, '{"h":"1"}')


def test_the_printable_check_is_str_isprintable_for_every_assigned_character(
    conn: psycopg.Connection[Any],
) -> None:
    """Python refuses unassigned code points too; which those are depends on its Unicode version, and
    the SQL check lets them through (migration 0010)."""
    assigned = "".join(
        chr(cp)
        for cp in range(1, 0x110000)
        if not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) != "Cn"
    )
    [(refused,)] = conn.execute(
        "SELECT string_agg(c, '') FROM regexp_split_to_table(%s, '') AS c WHERE NOT shardq_is_printable(c)",
        (assigned,),
    ).fetchall()
    assert refused == "".join(c for c in assigned if not c.isprintable())
    samples = ["plain", "it's", 'say "hi"', "both ' and \"", "back\\slash", "\t\n\r\x07\x7f\xa0",
               "\u2028\ufeff", "\U000e0001\U00100000", "é😀", ""]  # fmt: skip
    [(reprs,)] = conn.execute("SELECT array_agg(shardq_py_repr(s) ORDER BY o) FROM unnest(%s::text[]) "
                              "WITH ORDINALITY AS v(s, o)", (samples,)).fetchall()  # fmt: skip
    assert reprs == [repr(s) for s in samples]

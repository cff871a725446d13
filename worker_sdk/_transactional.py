"""Enqueue inside the application's own PostgreSQL transaction: the job commits with the caller's
rows or not at all.

These helpers call the SQL functions the dispatcher's migrations create (shardq_enqueue_v2 and
shardq_enqueue_many_v2, the versioned contract) on the connection the caller passes, inside its
transaction: they never commit, roll back or open a connection. The dispatcher hears of the jobs
when the transaction commits and queues them; a rollback leaves nothing behind.

Tracing is the client's: with OpenTelemetry set up, each call makes the PRODUCER span
``send <type>`` and puts its context in the jobs' headers (worker_sdk/_tracing.py), so the trace
of the request that opened the transaction continues in the handler.

The connection may be a psycopg 3 ``Connection``/``AsyncConnection`` (or a cursor of one), an
SQLAlchemy ``Session``/``Connection`` (``AsyncSession``/``AsyncConnection`` for the async forms), or
any DB-API cursor taking ``%s`` parameters (Django's ``connection.cursor()``, psycopg2). Neither
psycopg nor SQLAlchemy is a dependency of the SDK: they are recognised by the object's module and
imported only when the caller's object comes from them.

Errors: bad input raises InvalidArgumentError with the RPC's message naming the field (the function
checks what the dispatcher checks); like any failed statement it aborts the caller's transaction, so
nothing of it is committed. Options the SDK itself refuses (an unknown priority, run_at and delay
together) raise ValueError before any SQL is sent, as Client.enqueue does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import grpc

from shardq_common.pb import shardq_pb2 as pb

from . import _tracing
from ._calls import specs
from ._convert import PRIORITY_NAMES, job_spec
from ._errors import InvalidArgumentError, ShardqError

_ARGS = (
    ("job_type", "text"),
    ("payload", "bytea"),
    ("priority", "text"),
    ("run_at_ms", "bigint"),
    ("delay_ms", "bigint"),
    ("max_attempts", "integer"),
    ("lease_ttl_ms", "integer"),
    ("idempotency_key", "text"),
    ("concurrency_key", "text"),
    ("headers", "jsonb"),
)
#: JobSpec fields the SQL functions do not take: a job with dependencies (issue 21) needs the
#: dispatcher's transaction (edges, 'waiting', its scope checks), so it is refused here.
RPC_ONLY = ("depends_on", "ref", "blocks")
_ONE = "shardq_enqueue_v2"
_MANY = "shardq_enqueue_many_v2"
# SQLSTATEs the functions raise: bad input (invalid_parameter_value), no dispatcher ever started on the
# database (object_not_in_prerequisite_state), and the function missing (undefined_function).
_BAD_INPUT = "22023"
_NOT_SET_UP = "55000"
_NO_FUNCTION = "42883"


def _values(spec: pb.JobSpec) -> list[Any]:
    if spec.depends_on or spec.ref or spec.blocks:
        raise ValueError(
            "a job with depends_on, ref or blocks cannot be enqueued in a transaction: use the client"
        )
    return [
        spec.type,
        bytes(spec.payload),
        PRIORITY_NAMES.get(spec.priority),  # unspecified: NULL, the default
        spec.run_at_ms if spec.HasField("run_at_ms") else None,
        spec.delay_ms if spec.HasField("delay_ms") else None,
        spec.max_attempts if spec.HasField("max_attempts") else None,
        spec.lease_ttl_ms if spec.HasField("lease_ttl_ms") else None,
        spec.idempotency_key or None,
        spec.concurrency_key or None,
        json.dumps(dict(spec.headers)) if spec.headers else None,  # the function checks them
    ]


def _columns(job_specs: Sequence[pb.JobSpec]) -> list[Any]:
    """One array per argument of shardq_enqueue_many_v2; an optional one with no entry given is NULL."""
    columns: list[Any] = [list(column) for column in zip(*(_values(s) for s in job_specs), strict=True)]
    if not columns:
        columns = [[] for _ in _ARGS]
    return [c if i < 2 or any(v is not None for v in c) else None for i, c in enumerate(columns)]


def _sql(function: str, style: str, array: bool) -> str:
    suffix = "[]" if array else ""
    if style == "sqlalchemy":
        args = ", ".join(f"CAST(:{name} AS {kind}{suffix})" for name, kind in _ARGS)
    else:
        args = ", ".join(f"%s::{kind}{suffix}" for _, kind in _ARGS)
    return f"SELECT {function}({args})"


def _style(conn: Any) -> str:
    module = type(conn).__module__
    if module.startswith("sqlalchemy."):
        return "sqlalchemy"
    if module.startswith("psycopg.") or module == "psycopg":
        return "psycopg"
    if callable(getattr(conn, "execute", None)) and callable(getattr(conn, "fetchone", None)):
        return "cursor"
    raise TypeError(
        f"not a database connection shardq can use: {type(conn).__qualname__} (pass a psycopg connection "
        "or cursor, an SQLAlchemy Session or Connection, or a DB-API cursor)"
    )


def _statement(conn: Any, function: str, values: list[Any], array: bool) -> tuple[str, Any, Any]:
    """(style, statement, parameters) for the connection's library."""
    style = _style(conn)
    sql = _sql(function, style, array)
    if style == "sqlalchemy":
        from sqlalchemy import text  # the caller's object comes from SQLAlchemy: it is installed

        return style, text(sql), dict(zip((name for name, _ in _ARGS), values, strict=True))
    return style, sql, values


def _translated(exc: BaseException) -> ShardqError | None:
    """The SDK's error for a failure of the functions, found in the driver's exception (SQLAlchemy and
    Django wrap it: .orig, __cause__); None for any other failure, which is raised as it is."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if state:
            diag = getattr(seen, "diag", None)
            message = getattr(diag, "message_primary", None) or str(seen).splitlines()[0]
            if state == _BAD_INPUT:
                return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, message)
            if state == _NOT_SET_UP:
                return ShardqError(grpc.StatusCode.FAILED_PRECONDITION, message)
            if state == _NO_FUNCTION and ("shardq_enqueue" in message):
                return ShardqError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{message}: this database has no shardq enqueue functions of this version (a "
                    "dispatcher of this version or later creates them, migration 0010, when it starts on "
                    "this PostgreSQL database)",
                )
            return None
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _run(conn: Any, function: str, values: list[Any], array: bool) -> Any:
    style, statement, params = _statement(conn, function, values, array)
    if style in ("sqlalchemy", "psycopg") and _is_async(conn):
        raise TypeError(f"{type(conn).__qualname__} is asynchronous: use the _async form of this function")
    try:
        if style == "sqlalchemy":
            return conn.execute(statement, params).scalar_one()
        if style == "psycopg":
            row = conn.execute(statement, params).fetchone()
        else:
            conn.execute(statement, params)
            row = conn.fetchone()
    except Exception as exc:
        translated = _translated(exc)
        if translated is None:
            raise
        raise translated from exc
    return row[0]


async def _run_async(conn: Any, function: str, values: list[Any], array: bool) -> Any:
    style, statement, params = _statement(conn, function, values, array)
    if not _is_async(conn):
        raise TypeError(f"{type(conn).__qualname__} is synchronous: use the form without _async")
    try:
        if style == "sqlalchemy":
            return (await conn.execute(statement, params)).scalar_one()
        cursor = await conn.execute(statement, params)
        row = await cursor.fetchone()
    except Exception as exc:
        translated = _translated(exc)
        if translated is None:
            raise
        raise translated from exc
    return row[0]


def _is_async(conn: Any) -> bool:
    name = type(conn).__name__
    return name.startswith("Async")


def enqueue_in_transaction(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    priority: str = "default",
    run_at: datetime | float | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    lease_ttl: float | timedelta | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """Enqueue one job in the transaction open on ``conn``; returns its id (the existing job's id when
    a job of the type holds the idempotency key). It runs once the transaction commits, never if it
    rolls back. The arguments are Client.enqueue's (the trace context joins the headers as there)."""
    spec = job_spec(
        job_type, payload, priority=priority, run_at=run_at, delay=delay, max_attempts=max_attempts,
        lease_ttl=lease_ttl, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
        headers=headers,
    )  # fmt: skip
    with _tracing.sending([spec]) as span:
        job_id = str(_run(conn, _ONE, _values(spec), array=False))
        _tracing.sent(span, [job_id])
    return job_id


def enqueue_many_in_transaction(conn: Any, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]) -> list[str]:
    """Enqueue a batch in the transaction open on ``conn`` (each job a dict of enqueue's arguments with
    "type" and "payload" keys, as for Client.enqueue_many); returns the ids in order. At most the
    dispatcher's SHARDQ_MAX_BATCH jobs (10,000) per call; a transaction may make many calls."""
    job_specs = specs(jobs)
    with _tracing.sending(job_specs) as span:
        job_ids = [str(i) for i in _run(conn, _MANY, _columns(job_specs), array=True)]
        _tracing.sent(span, job_ids)
    return job_ids


async def enqueue_in_transaction_async(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    priority: str = "default",
    run_at: datetime | float | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    lease_ttl: float | timedelta | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """enqueue_in_transaction on a psycopg AsyncConnection or an SQLAlchemy AsyncSession/AsyncConnection."""
    spec = job_spec(
        job_type, payload, priority=priority, run_at=run_at, delay=delay, max_attempts=max_attempts,
        lease_ttl=lease_ttl, idempotency_key=idempotency_key, concurrency_key=concurrency_key,
        headers=headers,
    )  # fmt: skip
    with _tracing.sending([spec]) as span:
        job_id = str(await _run_async(conn, _ONE, _values(spec), array=False))
        _tracing.sent(span, [job_id])
    return job_id


async def enqueue_many_in_transaction_async(
    conn: Any, jobs: Iterable[Mapping[str, Any] | pb.JobSpec]
) -> list[str]:
    """enqueue_many_in_transaction on a psycopg AsyncConnection or an SQLAlchemy
    AsyncSession/AsyncConnection."""
    job_specs = specs(jobs)
    with _tracing.sending(job_specs) as span:
        job_ids = [str(i) for i in await _run_async(conn, _MANY, _columns(job_specs), array=True)]
        _tracing.sent(span, job_ids)
    return job_ids

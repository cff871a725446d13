"""The SDK's transactional enqueue helpers take the caller's psycopg or SQLAlchemy connection, but
neither library is a dependency of the SDK: importing it must not import them."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_importing_the_sdk_imports_neither_psycopg_nor_sqlalchemy() -> None:
    code = "import sys, worker_sdk; print(sorted(m for m in ('psycopg', 'sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_a_connection_of_no_known_kind_is_refused_before_anything_is_sent() -> None:
    import pytest

    from worker_sdk import enqueue_in_transaction

    with pytest.raises(TypeError, match="not a database connection shardq can use"):
        enqueue_in_transaction(object(), "noop")


def test_every_field_of_a_job_spec_is_an_argument_of_the_sql_function() -> None:
    """A field the RPC takes and the SQL function does not would be dropped from a job enqueued in a
    transaction: a new JobSpec field needs a new version of the functions (and of the helpers)."""
    from shardq_common.pb import shardq_pb2 as pb
    from worker_sdk._transactional import _ARGS, RPC_ONLY, _values

    names = ["job_type" if f.name == "type" else f.name for f in pb.JobSpec.DESCRIPTOR.fields]
    assert names == [name for name, _ in _ARGS] + list(RPC_ONLY)
    with pytest.raises(ValueError, match="depends_on"):  # refused, not dropped
        _values(pb.JobSpec(type="t", depends_on=[pb.Dependency(job="x")]))
    full = pb.JobSpec(
        type="t", payload=b"p", priority=pb.PRIORITY_HIGH, run_at_ms=1, max_attempts=2, lease_ttl_ms=3,
        idempotency_key="i", concurrency_key="c", headers={"h": "v"},
    )  # fmt: skip
    assert _values(full) == ["t", b"p", "high", 1, None, 2, 3, "i", "c", '{"h": "v"}']

"""The SDK's transactional enqueue helpers take the caller's psycopg or SQLAlchemy connection, but
neither library is a dependency of the SDK: importing it must not import them."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_sdk_imports_neither_psycopg_nor_sqlalchemy() -> None:
    code = "import sys, worker_sdk; print(sorted(m for m in ('psycopg', 'sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_a_connection_of_no_known_kind_is_refused_before_anything_is_sent() -> None:
    import pytest

    from worker_sdk import enqueue_in_transaction

    with pytest.raises(TypeError, match="not a database connection shardq can use"):
        enqueue_in_transaction(object(), "noop")


def test_fields_the_sql_functions_do_not_take_are_refused_not_dropped() -> None:
    import pytest

    from worker_sdk import enqueue_many_in_transaction

    for field, value in (("concurrency_key", "tenant-a"), ("headers", {"tenant": "acme"})):
        with pytest.raises(ValueError, match=f"^{field}: shardq_enqueue_v1 takes none"):
            enqueue_many_in_transaction(object(), [{"type": "noop", field: value}])

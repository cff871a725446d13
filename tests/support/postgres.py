"""Throwaway PostgreSQL databases for tests.

``SHARDQ_TEST_PG_URL`` names an admin database (``postgresql://user@host:port/postgres``); each
:class:`TempDatabase` creates a uniquely named database on that server and drops it afterwards.
``scripts/test`` sets the variable (to a local server, or to a cluster it starts).
"""

from __future__ import annotations

import os
import uuid
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ENV_VAR = "SHARDQ_TEST_PG_URL"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def can_connect(url: str, timeout: float = 3.0) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=max(1, round(timeout)), autocommit=True):
            return True
    except psycopg.Error:
        return False


def admin_url() -> tuple[str | None, str]:
    """(URL of an admin database, or None; where it came from or why there is none)."""
    url = os.environ.get(ENV_VAR, "").strip()
    if url:
        return url, f"{ENV_VAR}"
    if can_connect(DEFAULT_URL):
        return DEFAULT_URL, f"{ENV_VAR} unset; a server answers at 127.0.0.1:5432"
    return None, (
        f"no PostgreSQL for tests: {ENV_VAR} is unset and nothing accepts {DEFAULT_URL} "
        "(run the suite with ./scripts/test, which finds or starts one, or set the variable)"
    )


def database_url(admin: str, name: str) -> str:
    """``admin`` with its database replaced by ``name`` (user, host, port and query kept)."""
    parts = urlsplit(admin)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"{ENV_VAR} must be a postgresql:// URL, got scheme {parts.scheme!r}")
    return urlunsplit(parts._replace(path=f"/{name}"))


class TempDatabase:
    """A fresh database, created by :meth:`create` and dropped (connections and all) by :meth:`drop`."""

    def __init__(self, admin: str, prefix: str = "shardq_test") -> None:
        self.admin_url = admin
        self.name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        self.url = database_url(admin, self.name)

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)

    def create(self) -> str:
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self.url

    def drop(self) -> None:
        with self._admin() as conn:
            if conn.info.server_version >= 130000:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
                )
            else:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.name,),
                )
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))

    def __enter__(self) -> str:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.drop()

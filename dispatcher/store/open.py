"""Pick the backend from the URL."""

from __future__ import annotations

from shardq_common.errors import ConfigError

from .base import Store


async def open_store(url: str) -> Store:
    """``postgresql://...`` / ``postgres://...`` or ``sqlite:///path`` (``sqlite://:memory:`` for tests)."""
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        pg = PostgresStore(url)
        await pg.open()
        return pg
    if url.startswith("sqlite://"):
        from .sqlite import SqliteStore

        # sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy spells them.
        path = url.removeprefix("sqlite://")
        path = path[1:] if path.startswith("/") else path
        lite = SqliteStore(path if path else ":memory:")
        await lite.open()
        return lite
    raise ConfigError(f"unsupported database URL {url.split(':', 1)[0]!r}: use postgresql:// or sqlite:///")

"""Pick a backend from a database URL."""

from __future__ import annotations

from pathlib import Path

from dex.errors import InvalidInput
from dex.server.store.base import Store

SQLITE = "sqlite:///"


def open_store(url: str, partitions: int = 64) -> Store:
    """An unopened store for ``sqlite:///relative/path``, ``sqlite:////absolute/path`` or
    ``postgresql://user@host:port/database`` (``postgres://`` too; ``partitions``: how many
    a database it creates gets)."""
    if url.startswith(SQLITE):
        from dex.server.store.sqlite import SqliteStore

        path = url[len(SQLITE) :]
        if not path:
            raise InvalidInput(f"{url!r} names no file: use sqlite:///path/to/dex.sqlite3")
        return SqliteStore(Path(path))
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from dex.server.store.postgres import PostgresStore
        except ImportError as e:
            raise InvalidInput(
                f"PostgreSQL needs psycopg: pip install 'dex-runtime[postgres]' ({e})"
            ) from e
        return PostgresStore(url, partitions=partitions)
    raise InvalidInput(
        f"unknown database URL {url!r}: use sqlite:///path or postgresql://user@host/database"
    )

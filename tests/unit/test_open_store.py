"""``--database`` URLs: which store each one opens, and a clear error for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from dex.errors import InvalidInput
from dex.server.config import ServerConfig
from dex.server.store.open import open_store
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore


def test_sqlite_urls_name_a_relative_or_an_absolute_file() -> None:
    relative = open_store("sqlite:///data/dex.sqlite3")
    absolute = open_store("sqlite:////var/lib/dex/dex.sqlite3")

    assert isinstance(relative, SqliteStore) and relative.path == Path("data/dex.sqlite3")
    assert isinstance(absolute, SqliteStore)
    assert absolute.path == Path("/var/lib/dex/dex.sqlite3")


@pytest.mark.parametrize(
    "url", ["postgresql://dex@db:5432/dex", "postgres://dex@db/dex?sslmode=require"]
)
def test_postgres_urls_open_the_postgres_store(url: str) -> None:
    store = open_store(url)

    assert isinstance(store, PostgresStore) and store.url == url


@pytest.mark.parametrize("url", ["mysql://db/dex", "sqlite://dex.sqlite3", "sqlite:///", "dex"])
def test_other_urls_are_refused_with_what_to_write(url: str) -> None:
    with pytest.raises(InvalidInput, match="sqlite:///"):
        open_store(url)


def test_the_default_database_is_sqlite_in_the_data_directory(tmp_path: Path) -> None:
    default = ServerConfig(data_dir=tmp_path)
    chosen = ServerConfig(data_dir=tmp_path, database="postgresql://dex@db/dex")

    store = open_store(default.database_url)

    assert isinstance(store, SqliteStore) and store.path == tmp_path / "dex.sqlite3"
    assert chosen.database_url == "postgresql://dex@db/dex"

"""The numbered schema migrations: they build the canonical schema, once each."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from dex.errors import StorageError
from dex.server.engine.state import SessionState
from dex.server.records import write
from dex.server.store import postgres as postgres_module
from dex.server.store import sqlite as sqlite_module
from dex.server.store.base import migrations
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore

# table -> column -> (declared type, NOT NULL, position in the primary key or 0).
# SQLite reports a TEXT PRIMARY KEY column as nullable unless it says NOT NULL.
SCHEMA: dict[str, dict[str, tuple[str, bool, int]]] = {
    "meta": {"key": ("TEXT", False, 1), "value": ("TEXT", True, 0)},
    "agents": {
        "name": ("TEXT", False, 1),
        "spec": ("TEXT", True, 0),
        "updated_at": ("DOUBLE PRECISION", True, 0),
    },
    "sessions": {
        "id": ("TEXT", False, 1),
        "agent": ("TEXT", True, 0),
        "created_at": ("DOUBLE PRECISION", True, 0),
        "status": ("TEXT", True, 0),
        "state": ("TEXT", True, 0),
        "turn": ("INTEGER", False, 0),
    },
    "steps": {
        "session_id": ("TEXT", True, 1),
        "turn": ("INTEGER", True, 2),
        "seq": ("INTEGER", True, 3),
        "step": ("TEXT", True, 0),
    },
    "calls": {
        "session_id": ("TEXT", True, 1),
        "turn": ("INTEGER", True, 2),
        "seq": ("INTEGER", True, 3),
        "call": ("TEXT", True, 0),
    },
    "history": {
        "session_id": ("TEXT", True, 1),
        "seq": ("INTEGER", True, 2),
        "item": ("TEXT", True, 0),
    },
    "turns": {
        "session_id": ("TEXT", True, 1),
        "number": ("INTEGER", True, 2),
        "status": ("TEXT", True, 0),
        "turn": ("TEXT", True, 0),
    },
    "messages": {
        "session_id": ("TEXT", True, 1),
        "message_id": ("TEXT", True, 2),
        "number": ("INTEGER", True, 0),
    },
}
# Named indexes (the primary keys' own indexes aside): name -> (table, columns).
INDEXES = {"sessions_running": ("sessions", ["status"])}

LATEST = max(number for number, _ in migrations("sqlite"))


def schema_of(path: Path) -> dict[str, dict[str, tuple[str, bool, int]]]:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: {
                name: (type_, bool(notnull), pk)
                for _, name, type_, notnull, _, pk in conn.execute(f"PRAGMA table_info({table})")
            }
            for table in tables
        }
    finally:
        conn.close()


def indexes_of(path: Path) -> dict[str, tuple[str, list[str]]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        ).fetchall()
        return {
            name: (table, [r[2] for r in conn.execute(f"PRAGMA index_info({name})")])
            for name, table in rows
        }
    finally:
        conn.close()


def stored_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])
    finally:
        conn.close()


async def open_and_close(path: Path) -> int:
    store = SqliteStore(path)
    await store.open()
    try:
        return await store.schema_version()
    finally:
        await store.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_migration_files_are_numbered_from_1_without_gaps(dialect: str) -> None:
    folder = resources.files("dex.server.store") / "migrations" / dialect
    names = sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql"))

    assert names, "no migrations found"
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", n) for n in names), names
    assert [number for number, _ in migrations(dialect)] == list(range(1, len(names) + 1))


async def test_migrating_a_new_database_gives_the_canonical_schema(tmp_path: Path) -> None:
    path = tmp_path / "dex.sqlite3"

    version = await open_and_close(path)

    assert version == LATEST
    assert stored_version(path) == LATEST
    assert schema_of(path) == SCHEMA
    assert indexes_of(path) == INDEXES


async def test_opening_again_runs_no_migration_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dex.sqlite3"
    assert await open_and_close(path) == LATEST
    store = SqliteStore(path)
    await store.open()
    await store.write(write(session=SessionState(id="s1", agent="a", created_at=1.0), create=True))
    await store.close()

    # A new migration that counts its runs: it runs once, on the next start.
    counting = (
        LATEST + 1,
        "CREATE TABLE IF NOT EXISTS runs (n INTEGER NOT NULL); INSERT INTO runs (n) VALUES (1);",
    )
    monkeypatch.setattr(
        sqlite_module, "migrations", lambda dialect: [*migrations(dialect), counting]
    )
    assert await open_and_close(path) == LATEST + 1
    assert await open_and_close(path) == LATEST + 1

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert conn.execute("SELECT id FROM sessions").fetchall() == [("s1",)]
    finally:
        conn.close()


async def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dex.sqlite3"
    await open_and_close(path)
    broken = (LATEST + 1, "CREATE TABLE extra (x INTEGER); SELECT * FROM no_such_table;")
    monkeypatch.setattr(sqlite_module, "migrations", lambda dialect: [*migrations(dialect), broken])

    store = SqliteStore(path)
    with pytest.raises(StorageError):
        await store.open()
    with pytest.raises(StorageError):  # it closed itself
        await store.schema_version()

    assert stored_version(path) == LATEST
    assert "extra" not in schema_of(path)
    monkeypatch.undo()
    assert await open_and_close(path) == LATEST


# --- PostgreSQL ----------------------------------------------------------------------------

PG_LATEST = max(number for number, _ in migrations("postgresql"))
TEXT_KEYS = {
    ("agents", "name"),
    ("sessions", "id"),
    ("history", "session_id"),
    ("steps", "session_id"),
    ("calls", "session_id"),
    ("turns", "session_id"),
    ("messages", "session_id"),
    ("messages", "message_id"),
    ("meta", "key"),
}


def pg_columns(url: str) -> dict[str, dict[str, str | None]]:
    """table -> column -> collation, for the tables of the public schema."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = 'public'"
        ).fetchall()
    out: dict[str, dict[str, str | None]] = {}
    for table, column, collation in rows:
        out.setdefault(table, {})[column] = collation
    return out


async def open_and_close_pg(url: str) -> int:
    store = PostgresStore(url)
    await store.open()
    try:
        return await store.schema_version()
    finally:
        await store.close()


async def test_postgres_migrations_give_the_sqlite_tables_with_byte_ordered_keys(
    postgres_url: str,
) -> None:
    assert await open_and_close_pg(postgres_url) == PG_LATEST

    columns = pg_columns(postgres_url)

    for table, expected in SCHEMA.items():
        assert set(columns[table]) == set(expected), table
    assert set(columns["dex_lease"]) == {"id", "epoch", "holder", "acquired_at"}
    assert {(t, c) for t, cols in columns.items() for c, coll in cols.items() if coll == "C"} == (
        TEXT_KEYS
    )


async def test_postgres_nodes_starting_at_once_run_each_migration_once(
    postgres_url: str,
) -> None:
    versions = await asyncio.gather(*(open_and_close_pg(postgres_url) for _ in range(4)))

    assert versions == [PG_LATEST] * 4
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT epoch FROM dex_lease").fetchall() == [(0,)]


async def test_a_failing_postgres_migration_changes_nothing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await open_and_close_pg(postgres_url)
    broken = (PG_LATEST + 1, "CREATE TABLE extra (x INTEGER); SELECT * FROM no_such_table;")
    monkeypatch.setattr(
        postgres_module, "migrations", lambda dialect: [*migrations(dialect), broken]
    )

    with pytest.raises(StorageError):
        await open_and_close_pg(postgres_url)

    assert "extra" not in pg_columns(postgres_url)
    monkeypatch.undo()
    assert await open_and_close_pg(postgres_url) == PG_LATEST

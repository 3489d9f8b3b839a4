"""The numbered schema migrations: they build the canonical schema, once each."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dex.errors import StorageError
from dex.server import records, views
from dex.server.engine import handlers
from dex.server.engine.state import SessionState, ToolCall, Turn, TurnStatus
from dex.server.records import write
from dex.server.store import postgres as postgres_module
from dex.server.store import sqlite as sqlite_module
from dex.server.store.base import SessionQuery, Store, migrations
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec, Approval, ModelResponse, ModelToolCall, ToolCallStatus, ToolSpec

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
        "updated_at": ("DOUBLE PRECISION", True, 0),
        "waiting_since": ("DOUBLE PRECISION", False, 0),
        "outcome_unknown": ("INTEGER", True, 0),
        "tenant": ("TEXT", False, 0),
        "input_tokens": ("INTEGER", True, 0),
        "output_tokens": ("INTEGER", True, 0),
        "cost_usd": ("DOUBLE PRECISION", True, 0),
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
        "outcome": ("TEXT", False, 0),
        "interrupted": ("INTEGER", False, 0),
    },
    "model_limits": {
        "grp": ("TEXT", False, 1),
        "spec": ("TEXT", True, 0),
        "updated_at": ("DOUBLE PRECISION", True, 0),
    },
    "tenant_budgets": {
        "tenant": ("TEXT", False, 1),
        "spec": ("TEXT", True, 0),
        "updated_at": ("DOUBLE PRECISION", True, 0),
    },
    "tenant_usage": {
        "tenant": ("TEXT", True, 1),
        "day": ("TEXT", True, 2),
        "input_tokens": ("INTEGER", True, 0),
        "output_tokens": ("INTEGER", True, 0),
        "cost_usd": ("DOUBLE PRECISION", True, 0),
        "calls": ("INTEGER", True, 0),
    },
}
# Named indexes (the primary keys' own indexes aside): name -> (table, columns).
INDEXES = {
    "sessions_created": ("sessions", ["created_at", "id"]),
    "sessions_updated": ("sessions", ["updated_at", "id"]),
    "sessions_agent": ("sessions", ["agent", "created_at", "id"]),
    "sessions_status": ("sessions", ["status", "created_at", "id"]),
    "sessions_status_updated": ("sessions", ["status", "updated_at", "id"]),
    "sessions_unknown": ("sessions", ["created_at", "id"]),
    "sessions_waiting": ("sessions", ["waiting_since", "id"]),
    "sessions_tenant": ("sessions", ["tenant", "created_at", "id"]),
    "sessions_tenant_updated": ("sessions", ["tenant", "updated_at", "id"]),
    "sessions_tenant_waiting": ("sessions", ["tenant", "waiting_since", "id"]),
}

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
    ("dex_nodes", "id"),
    ("tenant_budgets", "tenant"),
    ("tenant_usage", "tenant"),
    ("tenant_usage", "day"),
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
    assert set(columns["dex_partitions"]) == {"id", "epoch", "owner", "acquired_at"}
    assert set(columns["dex_nodes"]) == {"id", "key", "address", "standby", "joined_at"}
    assert {(t, c) for t, cols in columns.items() for c, coll in cols.items() if coll == "C"} == (
        TEXT_KEYS
    )
    assert partitions(postgres_url) == [(p, 0) for p in range(64)]  # the default count


def partitions(url: str) -> list[tuple[int, int]]:
    """(id, epoch) of each partition."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, epoch FROM dex_partitions ORDER BY id").fetchall()
    return [(int(p), int(e)) for p, e in rows]


async def test_postgres_fence_function_passes_the_current_epochs_and_refuses_others(
    postgres_url: str,
) -> None:
    await open_and_close_pg(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE dex_partitions SET epoch = 3 WHERE id = 7")
        conn.execute("SELECT dex_fence_partitions(%s, %s)", ([2, 7], [0, 3]))
        conn.execute("SELECT dex_fence_partitions(%s, %s)", ([], []))  # a batch of agents
        for parts, epochs in (([2, 7], [0, 2]), ([7], [4]), ([64], [0])):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT dex_fence_partitions(%s, %s)", (parts, epochs))
            assert refused.value.sqlstate == postgres_module.FENCED_SQLSTATE, parts


async def test_postgres_nodes_starting_at_once_run_each_migration_once(
    postgres_url: str,
) -> None:
    versions = await asyncio.gather(*(open_and_close_pg(postgres_url) for _ in range(4)))

    assert versions == [PG_LATEST] * 4
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT epoch FROM dex_lease").fetchall() == [(0,)]
    assert partitions(postgres_url) == [(p, 0) for p in range(64)]


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


def pg_indexes(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'sessions' "
            "AND indexname <> 'sessions_pkey'"
        ).fetchall()
    return {name for (name,) in rows}


async def test_postgres_migrations_give_the_sqlite_indexes(postgres_url: str) -> None:
    await open_and_close_pg(postgres_url)

    assert pg_indexes(postgres_url) == set(INDEXES)


# --- sessions stored before the fleet columns (SQLite 0002, PostgreSQL 0003) ------------------

T0 = 1_000.0
SPEC = AgentSpec(name="helper", tools=[ToolSpec(name="charge", approval=Approval.ALWAYS)])
NEW_FIELDS = ("updated_at", "last_turn_status", "unknown_ended")


@dataclass
class Before:
    """Rows as the versions before the fleet columns stored them."""

    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    """(id, agent, created_at, status, turn, state)"""
    turns: list[tuple[Any, ...]] = field(default_factory=list)
    """(session_id, number, status, turn)"""
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    """(session_id, turn, seq, json)"""

    def add(self, state: SessionState, ended: Turn | None = None, *, format: int) -> None:
        """``state`` (and its ended turn) as format 1 wrote it (Steps and calls inside the
        records) or as format 2 did (in rows of their own)."""
        if format == 1:
            self.sessions.append((*self._columns(state), None, _old(views.plain(state))))
            if ended is not None:
                self.turns.append(
                    (state.id, ended.number, ended.status.value, _old(views.plain(ended)))
                )
            return
        w = records.write(session=state, ended_turn=ended)
        assert w.session is not None
        self.sessions.append(
            (*self._columns(state), w.session.turn, _old(json.loads(w.session.state)))
        )
        if w.ended_turn is not None:
            t = w.ended_turn
            self.turns.append((state.id, t.number, t.status, t.turn))
        self.steps += [(state.id, r.turn, r.seq, r.json) for r in w.steps]
        self.calls += [(state.id, r.turn, r.seq, r.json) for r in w.calls]

    @staticmethod
    def _columns(state: SessionState) -> tuple[Any, ...]:
        return (state.id, state.agent, state.created_at, state.status.value)


def _old(data: dict[str, Any]) -> str:
    """A record's JSON without the fields the fleet columns brought."""
    for name in NEW_FIELDS:
        data.pop(name, None)
    return json.dumps(data, separators=(",", ":"))


def _waiting(session_id: str, note: str) -> SessionState:
    state = SessionState(id=session_id, agent="helper", created_at=T0)
    t, _ = handlers.receive_message(state, SPEC, "charge", None, T0 + 1)
    handlers.assign(state, t.ready[0].id, "w1", T0 + 1)
    call = ModelToolCall(id="c1", name="charge", arguments={"note": note})
    handlers.complete_model(state, SPEC, t.ready[0].id, 1, ModelResponse(tool_calls=[call]), T0 + 2)
    return state


def _failed(session_id: str) -> tuple[SessionState, Turn]:
    """An idle session whose turn 1 failed with an outcome_unknown call."""
    unknown = ToolCall(
        id="1.1",
        model_call_id="c1",
        name="charge",
        arguments={},
        kind=None,
        idempotency_key=f"{session_id}/1.1",
        status=ToolCallStatus.OUTCOME_UNKNOWN,
    )
    turn = Turn(
        number=1, status=TurnStatus.FAILED, started_at=T0, ended_at=T0 + 1, tool_calls=[unknown]
    )
    return SessionState(id=session_id, agent="helper", created_at=T0, messages_received=1), turn


def stored_before() -> Before:
    """In each format: a session whose last turn failed with an outcome_unknown call, one
    waiting for an approval (a NUL in its arguments), one whose approval is recorded; and
    one idle after a good turn."""
    before = Before()
    for f in (1, 2):
        before.add(*_failed(f"failed-{f}"), format=f)
        before.add(_waiting(f"waiting-{f}", "a\x00b"), format=f)
        approved = _waiting(f"approved-{f}", "ok")
        handlers.record_input(approved, {"kind": "approve", "call_id": "1.1"}, T0 + 3)
        before.add(approved, format=f)
    done = SessionState(id="done", agent="helper", created_at=T0 + 1, messages_received=1)
    before.add(
        done,
        Turn(number=1, status=TurnStatus.COMPLETED, started_at=T0, ended_at=T0 + 1),
        format=1,
    )
    return before


EXPECTED = {
    # id: (status, waiting_since, outcome_unknown, updated_at)
    **{f"failed-{f}": ("failed", None, 1, T0) for f in (1, 2)},
    **{f"waiting-{f}": ("waiting", T0 + 2, 0, T0) for f in (1, 2)},
    **{f"approved-{f}": ("running", None, 0, T0) for f in (1, 2)},
    "done": ("idle", None, 0, T0 + 1),
}


async def _check_filled(store: Store) -> None:
    listed = await store.list_sessions(SessionQuery(limit=10))
    got = {r.id: (r.status, r.waiting_since, r.outcome_unknown, r.updated_at) for r in listed}
    assert got == EXPECTED
    for f in (1, 2):
        raw = await store.load_session(f"failed-{f}")
        assert raw is not None
        failed, _, _ = records.session(raw)
        assert (failed.last_turn_status, failed.unknown_ended, failed.updated_at) == (
            TurnStatus.FAILED,
            1,
            T0,
        )
        assert failed.fleet_status().value == "failed"
        raw = await store.load_session(f"waiting-{f}")
        assert raw is not None
        waiting, _, _ = records.session(raw)
        assert waiting.turn is not None
        assert waiting.turn.tool_calls[0].arguments == {"note": "a\x00b"}
        assert waiting.last_turn_status is None and waiting.unknown_ended == 0
    in_a_turn = [f"{kind}-{f}" for kind in ("approved", "waiting") for f in (1, 2)]
    assert sorted(await store.running_sessions()) == sorted(in_a_turn)


COLUMNS = {
    "sessions": "id, agent, created_at, status, turn, state",
    "turns": "session_id, number, status, turn",
    "steps": "session_id, turn, seq, step",
    "calls": "session_id, turn, seq, call",
}


def insert(
    executemany: Callable[[str, list[tuple[Any, ...]]], Any], rows: Before, mark: str
) -> None:
    """Insert ``rows`` with a driver's ``executemany`` and its placeholder ``mark``."""
    for table, columns in COLUMNS.items():
        marks = ", ".join([mark] * len(columns.split(",")))
        executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", getattr(rows, table))


def _numbered(dialect: str, name: str) -> int:
    """The number of the migration file ``NNNN_{name}.sql`` of ``dialect``."""
    folder = resources.files("dex.server.store") / "migrations" / dialect
    (number,) = [int(e.name[:4]) for e in folder.iterdir() if e.name[5:] == f"{name}.sql"]
    return number


FLEET_SQLITE, FLEET_POSTGRES = _numbered("sqlite", "fleet"), _numbered("postgresql", "fleet")
"""The migrations that bring the fleet columns."""


async def test_sqlite_migration_fills_the_fleet_columns_of_stored_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dex.sqlite3"
    older = migrations("sqlite")[: FLEET_SQLITE - 1]
    monkeypatch.setattr(sqlite_module, "migrations", lambda dialect: older)
    await open_and_close(path)
    conn = sqlite3.connect(path)
    with conn:
        insert(conn.executemany, stored_before(), "?")
    conn.close()
    monkeypatch.undo()

    store = SqliteStore(path)
    await store.open()
    try:
        await _check_filled(store)
    finally:
        await store.close()


async def test_postgres_migration_fills_the_fleet_columns_of_stored_sessions(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = migrations("postgresql")[: FLEET_POSTGRES - 1]
    monkeypatch.setattr(postgres_module, "migrations", lambda dialect: older)
    # migrated as that release did (a store opens only a database with partitions)
    migrating = await postgres_module.connect(postgres_url)
    try:
        await postgres_module._migrate(migrating)
    finally:
        await migrating.close()
    with psycopg.connect(postgres_url) as conn, conn.cursor() as cur:
        insert(cur.executemany, stored_before(), "%s")
    monkeypatch.undo()

    store = PostgresStore(postgres_url)
    await store.open()
    try:
        await _check_filled(store)
    finally:
        await store.close()


# --- sessions stored before tenants (SQLite 0004, PostgreSQL 0006) ----------------------------

TENANTS_SQLITE = _numbered("sqlite", "tenants")


async def test_sessions_stored_before_tenants_have_none_and_a_new_one_keeps_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dex.sqlite3"
    older = migrations("sqlite")[: TENANTS_SQLITE - 1]
    monkeypatch.setattr(sqlite_module, "migrations", lambda dialect: older)
    await open_and_close(path)
    record = records.session_record(SessionState(id="old", agent="a", created_at=T0))
    state = record.state.replace('"tenant":null,', "")  # as that release wrote it
    assert "tenant" not in state
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO sessions (id, agent, created_at, status, state, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("old", "a", T0, "idle", state, T0),
        )
    conn.close()
    monkeypatch.undo()

    store = SqliteStore(path)
    await store.open()
    try:
        new = SessionState(id="new", agent="a", created_at=T0 + 1, tenant="acme")
        await store.write(write(session=new, create=True))
        rows = await store.list_sessions(SessionQuery(limit=10))
        assert [(r.id, r.tenant) for r in rows] == [("new", "acme"), ("old", None)]
        for sid, tenant in (("old", None), ("new", "acme")):
            stored = await store.load_session(sid)
            assert stored is not None
            assert records.session(stored, sid)[0].tenant == tenant
    finally:
        await store.close()

"""A starting node finds the sessions it must recover without reading the idle ones: its
work at start does not grow with the sessions stored, however many there are."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg

from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.state import SessionState
from dex.server.store.base import Store
from dex.server.store.postgres import PostgresStore
from dex.server.store.sql import RUNNING_SESSIONS
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec

SPEC = AgentSpec(name="a")


def in_a_turn(session_id: str) -> SessionState:
    state = SessionState(id=session_id, agent="a", created_at=1.0)
    handlers.receive_message(state, SPEC, "hello", None, 1.0)
    return state


async def store_sessions(store: Store, idle: range, running: list[str]) -> None:
    writes = [
        records.write(session=SessionState(id=f"i{n:06d}", agent="a", created_at=1.0), create=True)
        for n in idle
    ]
    writes += [records.write(session=in_a_turn(s), create=True) for s in running]
    await asyncio.gather(*(store.write(w) for w in writes))  # a few group commits


class CountingSqliteStore(SqliteStore):
    """Counts the SQLite virtual machine's instructions: work, measured without a clock."""

    steps = 0

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        conn.set_progress_handler(self._step, 10)
        return conn

    def _step(self) -> int:
        self.steps += 1
        return 0  # go on


async def finding_running_costs(path: Path, idle: int) -> tuple[list[str], int]:
    store = CountingSqliteStore(path)
    await store.open()
    try:
        await store_sessions(store, range(idle), ["r1", "r2"])
        before = store.steps
        found = await store.running_sessions()
        return found, store.steps - before
    finally:
        await store.close()


async def test_sqlite_finds_the_running_sessions_at_the_same_cost_among_many_idle(
    tmp_path: Path,
) -> None:
    few, few_cost = await finding_running_costs(tmp_path / "few.sqlite3", 100)
    many, many_cost = await finding_running_costs(tmp_path / "many.sqlite3", 5_000)

    assert few == many == ["r1", "r2"]
    assert many_cost <= 2 * few_cost + 10, (few_cost, many_cost)


async def postgres_finding_running_costs(url: str, idle: int) -> tuple[list[str], int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    store = PostgresStore(url)
    await store.open()
    try:
        await store_sessions(store, range(idle), ["r1", "r2"])
        found = await store.running_sessions()
    finally:
        await store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE sessions")
        [(plan,)] = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + RUNNING_SESSIONS
        ).fetchall()
    top = plan[0]["Plan"]
    return found, top["Shared Hit Blocks"] + top["Shared Read Blocks"]


async def test_postgres_finds_the_running_sessions_at_the_same_cost_among_many_idle(
    postgres_url: str,
) -> None:
    few, few_cost = await postgres_finding_running_costs(postgres_url, 100)
    many, many_cost = await postgres_finding_running_costs(postgres_url, 5_000)

    assert few == many == ["r1", "r2"]
    assert many_cost <= 2 * few_cost + 4, (few_cost, many_cost)

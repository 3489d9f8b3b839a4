"""A starting node finds the sessions it must recover without reading the idle ones: its
work at start does not grow with the sessions stored, however many there are."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import psycopg

from dex.server import records
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.engine import handlers
from dex.server.engine.state import SessionState
from dex.server.sessions import Sessions
from dex.server.store.base import Store, StoredSession
from dex.server.store.postgres import PostgresStore
from dex.server.store.sql import RUNNING_SESSIONS
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec

SPEC = AgentSpec(name="a")


def in_a_turn(session_id: str, handed_out: bool = False) -> SessionState:
    """A session whose turn's RunModel is queued, or (``handed_out``) running on a Worker."""
    now = time.time()  # the retry window of the attempt that fails at the start is open
    state = SessionState(id=session_id, agent="a", created_at=now)
    t, _ = handlers.receive_message(state, SPEC, "hello", None, now)
    state.history_length = len(t.history)
    if handed_out:
        handlers.assign(state, t.ready[0].id, "w1", now)
    return state


async def store_sessions(
    store: Store, idle: range, running: list[str], handed_out: int = 0
) -> None:
    writes = [
        records.write(session=SessionState(id=f"i{n:06d}", agent="a", created_at=1.0), create=True)
        for n in idle
    ]
    writes += [
        records.write(session=in_a_turn(s, n < handed_out), create=True)
        for n, s in enumerate(running)
    ]
    await asyncio.gather(*(store.write(w) for w in writes))  # a few group commits


def vm_steps(path: Path, sql: str) -> int:
    """The SQLite virtual machine's instructions for ``sql`` on the store's database (on
    a connection of this test's: the store's is in its writer process): work, measured
    without a clock."""
    conn = sqlite3.connect(path)
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    try:
        conn.set_progress_handler(step, 10)
        conn.execute(sql).fetchall()
        return steps
    finally:
        conn.close()


async def finding_running_costs(path: Path, idle: int) -> tuple[list[str], int]:
    store = SqliteStore(path)
    await store.open()
    try:
        await store_sessions(store, range(idle), ["r1", "r2"])
        return await store.running_sessions(), vm_steps(path, RUNNING_SESSIONS)
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


class RecordingSqliteStore(SqliteStore):
    """Records which sessions were loaded."""

    loaded: list[str]

    async def load_session(self, session_id: str) -> StoredSession | None:
        self.loaded.append(session_id)
        return await super().load_session(session_id)


async def test_a_start_loads_only_the_sessions_in_a_turn_and_recovers_them_all(
    tmp_path: Path,
) -> None:
    store = RecordingSqliteStore(tmp_path / "dex.sqlite3")
    store.loaded = []
    await store.open()
    try:
        await store.write(records.write(agents=[SPEC]))
        running = [f"r{n:03d}" for n in range(300)]
        await store_sessions(store, range(1_000), running, handed_out=100)
        sessions = Sessions(store, Dispatcher(heartbeat_timeout=5))

        failed = await sessions.start(parallel=128)  # three waves

        assert failed == 100  # each attempt a Worker held fails, its Step queues again
        assert sorted(store.loaded) == running
        assert await store.running_sessions() == running  # each turn goes on: queued again
        assert sum(sessions.dispatcher.queued().values()) == len(running)
        idle = await sessions.reads.snapshot("i000007")  # an idle one loads when it is used
        assert idle["session"]["status"] == "idle"
    finally:
        await store.close()

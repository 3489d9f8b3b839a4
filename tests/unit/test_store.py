"""Conformance tests for the ``Store`` interface, run against every backend.

The ``store`` fixture is parametrized over ``BACKENDS`` (SQLite, and PostgreSQL on a
fresh database: skipped only when PostgreSQL cannot be reached): a factory that builds
a fresh, empty store and can build a second one over the same data (to test reopening).
The store keeps JSON text; these tests encode and decode it as the domain does
(``dex.server.records``). Tests at the end of the file check what only the SQLite
backend promises (its pragmas, its group commit, its lock on the database).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson
import psycopg
import pytest

from dex.errors import CommitUnknown, Conflict, StorageError
from dex.server import records
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.engine import handlers
from dex.server.engine.state import SessionState, SessionStatus, Turn
from dex.server.records import write
from dex.server.sessions import Sessions
from dex.server.store.base import (
    SAID_CHARS,
    RememberedMessage,
    Said,
    SessionQuery,
    SessionRecord,
    SessionRow,
    Store,
    TenantUsage,
    TurnRecord,
    Write,
)
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore
from dex.testing.wait import wait_until_async
from dex.wire import (
    AgentSpec,
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    SummaryItem,
    ToolCallStatus,
    ToolKind,
    ToolResultItem,
    ToolSpec,
    UserItem,
)

T0 = 1_000.0
SPEC = AgentSpec(
    name="helper",
    instructions="be brief",
    tools=[ToolSpec(name="lookup", kind=ToolKind.READ), ToolSpec(name="charge")],
)


@dataclass
class Backend:
    name: str
    make: Callable[[], Store]
    """Builds a new, unopened store over this backend's (one) database."""


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "dex.sqlite3"
    return Backend("sqlite", lambda: SqliteStore(path))


def _postgres(request: pytest.FixtureRequest) -> Backend:
    url = request.getfixturevalue("postgres_url")  # skips when PostgreSQL is unreachable
    return Backend("postgres", lambda: PostgresStore(url))


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "sqlite": lambda request: _sqlite(request.getfixturevalue("tmp_path")),
    "postgres": _postgres,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param](request)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    s = backend.make()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


# --- helpers ---------------------------------------------------------------------------


def idle(session_id: str) -> SessionState:
    return SessionState(id=session_id, agent="helper", created_at=T0)


def in_a_turn(session_id: str) -> tuple[SessionState, list[Item]]:
    """A session in the middle of turn 1: the model asked for a tool that now runs."""
    state = idle(session_id)
    t, _ = handlers.receive_message(state, SPEC, "what is my balance?", "m-1", T0)
    history = list(t.history)
    step = state.turn.steps[0]  # type: ignore[union-attr]
    handlers.assign(state, step.id, "w1", T0 + 1)
    response = ModelResponse(
        tool_calls=[ModelToolCall(id="c1", name="lookup", arguments={"account": 7})]
    )
    t = handlers.complete_model(state, SPEC, step.id, 1, response, T0 + 2)
    history += t.history
    handlers.assign(state, t.ready[0].id, "w2", T0 + 3)
    state.history_length = len(history)
    return state, history


async def load(store: Store, session_id: str) -> tuple[SessionState, list[Item]] | None:
    raw = await store.load_session(session_id)
    if raw is None:
        return None
    state, history, _ = records.session(raw)
    return state, history


async def load_turn(store: Store, session_id: str, number: int) -> Turn | None:
    return records.maybe_turn(await store.load_turn(session_id, number))


async def load_turns(store: Store, session_id: str) -> list[Turn]:
    return [records.turn(raw) for raw in await store.load_turns(session_id)]


async def load_agents(store: Store) -> list[AgentSpec]:
    return [records.agent(raw) for raw in await store.load_agents()]


async def rows(store: Store, limit: int = 100, **query: Any) -> list[SessionRow]:
    return await store.list_sessions(SessionQuery(limit=limit, **query))


async def create(store: Store, state: SessionState, history: list[Item] | None = None) -> None:
    await store.write(write(session=state, create=True, history=history or []))


def user(n: int) -> UserItem:
    return UserItem(text=f"message {n}")


# --- sessions ----------------------------------------------------------------------------


async def test_a_created_session_loads_back_equal(store: Store) -> None:
    state, history = in_a_turn("s1")
    history += [
        ToolResultItem(call_id="c0", name="lookup", status=ToolCallStatus.SUCCEEDED, result=[1]),
        NoteItem(text="a note"),
        SummaryItem(text="a summary"),
    ]

    await create(store, state, history)
    loaded = await load(store, "s1")

    assert loaded is not None
    loaded_state, loaded_history = loaded
    assert loaded_state == state
    assert loaded_history == history
    assert await load(store, "nope") is None


async def test_creating_an_existing_session_is_a_conflict_and_keeps_the_first(
    store: Store,
) -> None:
    first = idle("s1")
    await create(store, first, [user(1)])
    second = SessionState(id="s1", agent="other", created_at=T0 + 1)

    with pytest.raises(Conflict):
        await store.write(
            write(
                session=second, create=True, history=[user(99)], message=RememberedMessage("m-x", 1)
            )
        )

    loaded = await load(store, "s1")
    assert loaded is not None
    assert loaded[0] == first
    assert loaded[1] == [user(1)]
    assert await store.find_message("s1", "m-x") is None
    [row] = await rows(store)
    assert row.agent == "helper"


async def test_an_update_replaces_the_state(store: Store) -> None:
    await create(store, idle("s1"))
    state, history = in_a_turn("s1")

    await store.write(write(session=state, history=history, history_start=0))

    loaded = await load(store, "s1")
    assert loaded is not None
    assert loaded[0] == state
    assert loaded[0].status == SessionStatus.RUNNING
    [row] = await rows(store)
    assert row.status == "running"


async def test_history_appends_in_order_across_writes(store: Store) -> None:
    await create(store, idle("s1"), [user(0)])
    state = idle("s1")
    written = 1
    for size in (3, 1, 12):
        items: list[Item] = [user(written + i) for i in range(size)]
        await store.write(write(session=state, history=items, history_start=written))
        written += size

    loaded = await load(store, "s1")

    assert loaded is not None
    assert loaded[1] == [user(n) for n in range(written)]


async def test_a_write_that_overlaps_stored_history_writes_nothing(store: Store) -> None:
    await create(store, idle("s1"), [user(0), user(1)])
    changed, _ = in_a_turn("s1")

    with pytest.raises(Conflict):
        await store.write(write(session=changed, history=[user(7)], history_start=1))

    loaded = await load(store, "s1")
    assert loaded is not None
    assert loaded[0] == idle("s1")  # the state update was rolled back with the history
    assert loaded[1] == [user(0), user(1)]


async def test_histories_of_sessions_are_separate(store: Store) -> None:
    await create(store, idle("a"), [user(1)])
    await create(store, idle("b"), [AssistantItem(text="b's")])

    a, b = await load(store, "a"), await load(store, "b")

    assert a is not None and a[1] == [user(1)]
    assert b is not None and b[1] == [AssistantItem(text="b's")]


# --- turns and messages --------------------------------------------------------------------


async def test_ended_turns_are_archived_and_loaded_by_number(store: Store) -> None:
    state = idle("s1")
    await create(store, state)
    ended: list[Turn] = []
    for n in (1, 2):
        t, _ = handlers.receive_message(state, SPEC, f"hello {n}", None, T0 + n)
        step = t.ready[0]
        handlers.assign(state, step.id, "w1", T0 + n)
        done = handlers.complete_model(
            state, SPEC, step.id, 1, ModelResponse(text=f"hi {n}"), T0 + n
        )
        assert done.ended_turn is not None
        ended.append(done.ended_turn)
        await store.write(write(session=state, ended_turn=done.ended_turn))
    await create(store, idle("other"))

    assert await load_turn(store, "s1", 1) == ended[0]
    assert await load_turn(store, "s1", 2) == ended[1]
    assert (await load_turn(store, "s1", 2)).text == "hi 2"  # type: ignore[union-attr]
    assert await load_turn(store, "s1", 3) is None
    assert await load_turn(store, "other", 1) is None
    assert await load_turns(store, "s1") == ended  # all of them, oldest first
    assert await load_turns(store, "other") == []


async def test_a_changed_call_of_an_archived_turn_replaces_its_row(store: Store) -> None:
    state, _ = in_a_turn("s1")
    await create(store, state)
    turn = state.turn
    assert turn is not None
    state.turn, state.status = None, SessionStatus.IDLE
    await store.write(write(session=state, ended_turn=turn))
    call = turn.tool_calls[0]
    call.status, call.result = ToolCallStatus.SUCCEEDED, {"reconciled": True}
    await store.write(write(session=state, archived_call=(turn.number, call)))

    assert await load_turn(store, "s1", 1) == turn
    assert (await load(store, "s1")) == (state, [])


async def test_archiving_the_same_turn_twice_is_a_conflict(store: Store) -> None:
    state = idle("s1")
    await create(store, state)
    turn = Turn(number=1, started_at=T0, ended_at=T0 + 1, text="first")
    await store.write(write(session=state, ended_turn=turn))

    with pytest.raises(Conflict):
        second = msgspec.structs.replace(turn, text="2nd")
        await store.write(write(session=state, ended_turn=second))

    assert await load_turn(store, "s1", 1) == turn


async def test_find_message_returns_the_number_of_a_remembered_message(store: Store) -> None:
    await create(store, idle("s1"))
    await create(store, idle("s2"))
    await store.write(write(session=idle("s1"), message=RememberedMessage("m-1", 1)))
    await store.write(write(session=idle("s1"), message=RememberedMessage("m-2", 2)))

    assert await store.find_message("s1", "m-1") == RememberedMessage("m-1", 1)
    assert await store.find_message("s1", "m-2") == RememberedMessage("m-2", 2)
    assert await store.find_message("s1", "m-3") is None
    assert await store.find_message("s2", "m-1") is None  # message ids are per session

    with pytest.raises(Conflict):
        await store.write(write(session=idle("s1"), message=RememberedMessage("m-1", 3)))
    assert await store.find_message("s1", "m-1") == RememberedMessage("m-1", 1)


async def test_find_message_returns_what_the_send_did(store: Store) -> None:
    await create(store, idle("s1"))
    steered = RememberedMessage("m-steer", 2, "steered")
    interrupting = RememberedMessage("m-stop", 3, "interrupted", 2)
    # one batch, as the committer's group commit writes them (PostgreSQL: one bulk insert)
    await asyncio.gather(
        store.write(write(session=idle("s1"), message=steered)),
        store.write(write(session=idle("s1"), message=interrupting)),
    )

    assert await store.find_message("s1", "m-steer") == steered
    assert await store.find_message("s1", "m-stop") == interrupting


async def test_running_sessions_lists_only_sessions_in_a_turn(store: Store) -> None:
    await create(store, idle("a"))
    await create(store, in_a_turn("b")[0])
    await create(store, in_a_turn("c")[0])

    assert sorted(await store.running_sessions()) == ["b", "c"]

    await store.write(write(session=idle("b")))

    assert await store.running_sessions() == ["c"]


async def test_the_list_reads_each_sessions_last_message_when_asked(store: Store) -> None:
    """The latest user message or assistant text, whatever tool results and notes follow
    it; None before anything was said; the row without it unless asked."""
    state, history = in_a_turn("asked")  # "what is my balance?", then a reply of tool calls
    await create(store, state, history)
    replied: list[Item] = [
        user(1),
        AssistantItem(text="your balance is " + "9" * 400),
        ToolResultItem(call_id="c0", name="lookup", status=ToolCallStatus.SUCCEEDED),
        NoteItem(text="a note"),
    ]
    await create(store, idle("replied"), replied)
    await create(store, idle("quiet"))

    listed = {row.id: row for row in await rows(store, last_message=True)}

    said = {sid: getattr(row, "last_message", "absent") for sid, row in listed.items()}
    assert said == {
        "asked": Said("user", "what is my balance?"),
        "replied": Said("assistant", ("your balance is " + "9" * 400)[:SAID_CHARS]),
        "quiet": None,
    }
    assert all(type(row) is SessionRow for row in await rows(store))  # not asked: not read


async def test_the_list_reads_each_sessions_usage_from_its_state(store: Store) -> None:
    """What its committed model calls used (a state written before budgets: nothing)."""
    used = idle("used")
    used.usage.add(1_200, 34, 0.0123)
    await create(store, used, [])
    await create(store, idle("new"))
    listed = {row.id: row.usage for row in await rows(store)}
    assert listed == {
        "used": {"input_tokens": 1_200, "output_tokens": 34, "cost_usd": 0.0123},
        "new": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
    }
    [row] = [r for r in await rows(store, last_message=True) if r.id == "used"]
    assert row.usage == listed["used"]


# --- agents -----------------------------------------------------------------------------------


async def test_agents_are_upserted_by_name(store: Store) -> None:
    old = AgentSpec(name="helper", instructions="old")
    new = AgentSpec(name="helper", instructions="new", tools=[ToolSpec(name="lookup")])
    other = AgentSpec(name="aide")

    await store.write(write(agents=[old]))
    assert await load_agents(store) == [old]

    await store.write(write(agents=[new, other]))
    assert await load_agents(store) == [other, new]


# --- concurrency and durability ------------------------------------------------------------------


async def test_a_failing_write_among_concurrent_writes_fails_alone(store: Store) -> None:
    await create(store, idle("taken"), [user(0)])
    writes = [write(session=idle(f"s{i:02}"), create=True, history=[user(i)]) for i in range(40)]
    bad = write(session=SessionState(id="taken", agent="x", created_at=T0), create=True)
    writes.insert(17, bad)

    results = await asyncio.gather(*(store.write(w) for w in writes), return_exceptions=True)

    assert isinstance(results[17], Conflict)
    assert [r for i, r in enumerate(results) if i != 17] == [None] * 40
    for i in range(40):
        loaded = await load(store, f"s{i:02}")
        assert loaded is not None and loaded[1] == [user(i)]
    taken = await load(store, "taken")
    assert taken is not None and taken[0] == idle("taken")


async def test_the_counters_the_metrics_read_count_a_commit_and_what_it_wrote(
    store: Store,
) -> None:
    before = store.counters()
    written = write(session=idle("s"), create=True, history=[user(0)])

    await store.write(written)

    after = store.counters()
    assert after.commits == before.commits + 1
    assert after.operations == before.operations + 1
    assert after.bytes_written == before.bytes_written + written.size()
    assert written.size() > 0
    assert after.busy_seconds > before.busy_seconds
    assert after.commit_failures == before.commit_failures


async def test_data_survives_close_and_reopen(backend: Backend) -> None:
    first = backend.make()
    await first.open()
    state, history = in_a_turn("s1")
    await first.write(
        write(session=state, create=True, history=history, message=RememberedMessage("m-1", 1))
    )
    await first.write(write(session=idle("s2"), create=True, agents=[SPEC]))
    await first.close()

    second = backend.make()
    await second.open()
    try:
        loaded = await load(second, "s1")
        assert loaded == (state, history)
        assert await second.find_message("s1", "m-1") == RememberedMessage("m-1", 1)
        assert await load_agents(second) == [SPEC]
        assert await second.running_sessions() == ["s1"]
    finally:
        await second.close()


async def test_a_store_that_is_not_open_refuses_calls(backend: Backend) -> None:
    s = backend.make()
    with pytest.raises(StorageError):
        await load(s, "s1")
    await s.open()
    await s.close()
    with pytest.raises(StorageError):
        await s.write(write(session=idle("s1"), create=True))


async def test_a_call_racing_close_is_answered_and_committed_or_refused(
    backend: Backend,
) -> None:
    s = backend.make()
    await s.open()
    one = write(session=idle("s1"), create=True)

    async with asyncio.timeout(30):  # a guard: without an answer the write would wait forever
        closed, written = await asyncio.gather(s.close(), s.write(one), return_exceptions=True)

    assert closed is None
    assert written is None or isinstance(written, StorageError)
    again = backend.make()
    await again.open()
    try:
        loaded = await load(again, "s1")
    finally:
        await again.close()
    assert (loaded is not None) == (written is None)  # acknowledged exactly when committed


# --- SQLite only ---------------------------------------------------------------------------


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "dex.sqlite3")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_sqlite_commits_are_durable_wal_with_synchronous_full(
    sqlite_store: SqliteStore,
) -> None:
    # synchronous is per connection, so ask the store's own connection (in its writer
    # process); journal_mode=WAL is recorded in the file itself.
    [[(synchronous,)]] = await sqlite_store._read([("PRAGMA synchronous", ())])
    assert synchronous == 2  # FULL

    other = sqlite3.connect(sqlite_store.path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


async def in_one_batch(store: SqliteStore, writes: list[Write]) -> list[Any]:
    """Commit ``writes`` in group commits: queued in one turn of the event loop, the first
    goes at once to the idle writer, and the others in one frame behind it (the writer
    may take both frames in one commit)."""
    commits = store.commits
    results = await asyncio.gather(*(store.write(w) for w in writes), return_exceptions=True)
    assert store.commits - commits in (1, 2)
    return results


async def test_sqlite_a_failing_write_inside_one_group_commit_fails_alone(
    sqlite_store: SqliteStore,
) -> None:
    await create(sqlite_store, idle("taken"))
    operations = sqlite_store.operations
    writes = [write(session=idle(f"s{i}"), create=True, history=[user(i)]) for i in range(10)]
    writes.insert(4, write(session=SessionState(id="taken", agent="x", created_at=T0), create=True))

    results = await in_one_batch(sqlite_store, writes)

    assert sqlite_store.operations - operations == 11
    assert isinstance(results[4], Conflict)
    assert [r for i, r in enumerate(results) if i != 4] == [None] * 10
    for i in range(10):
        loaded = await load(sqlite_store, f"s{i}")
        assert loaded is not None and loaded[1] == [user(i)]
    taken = await load(sqlite_store, "taken")
    assert taken is not None and taken[0].agent == "helper"


async def test_sqlite_a_batch_of_500_creations_commits_all(sqlite_store: SqliteStore) -> None:
    writes = [
        write(session=idle(f"s{i}"), create=True, history=[user(i), user(i + 1)])
        for i in range(500)
    ]

    assert await in_one_batch(sqlite_store, writes) == [None] * 500

    assert len(await rows(sqlite_store, limit=1000)) == 500
    for i in (0, 110, 111, 499):
        loaded = await load(sqlite_store, f"s{i}")
        assert loaded is not None and loaded[1] == [user(i), user(i + 1)]


async def test_sqlite_the_same_id_twice_in_one_batch_fails_the_second_only(
    sqlite_store: SqliteStore,
) -> None:
    first = SessionState(id="twin", agent="first", created_at=T0)
    second = SessionState(id="twin", agent="second", created_at=T0)
    writes = [write(session=idle(f"s{i}"), create=True) for i in range(5)]
    writes[1:1] = [write(session=first, create=True), write(session=second, create=True)]

    results = await in_one_batch(sqlite_store, writes)

    assert isinstance(results[2], Conflict)
    assert [r for i, r in enumerate(results) if i != 2] == [None] * 6
    twin = await load(sqlite_store, "twin")
    assert twin is not None and twin[0].agent == "first"
    assert len(await rows(sqlite_store)) == 6


async def test_sqlite_a_store_that_failed_to_open_refuses_calls(tmp_path: Path) -> None:
    path = tmp_path / "dex.sqlite3"
    path.mkdir()  # a directory where the database file should be
    s = SqliteStore(path)

    with pytest.raises(StorageError):
        await s.open()

    async with asyncio.timeout(30):  # a guard: a call on a dead writer would wait forever
        with pytest.raises(StorageError):
            await load(s, "s1")

        path.rmdir()  # the cause is fixed: the same store opens
        await s.open()
        try:
            assert await load(s, "s1") is None
        finally:
            await s.close()


# --- PostgreSQL only -------------------------------------------------------------------------


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(postgres_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@asynccontextmanager
async def row_locked(url: str, session_id: str) -> AsyncIterator[None]:
    """Another connection holds ``session_id``'s row: the store's writer blocks on it."""
    async with await psycopg.AsyncConnection.connect(url) as other:
        await other.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
        yield
        await other.rollback()


async def test_postgres_the_writer_commits_with_synchronous_commit_on(
    pg_store: PostgresStore,
) -> None:
    assert pg_store._conn is not None
    cur = await pg_store._conn.execute("SHOW synchronous_commit")
    assert await cur.fetchone() == ("on",)


async def test_postgres_a_failing_write_inside_one_group_commit_fails_alone(
    pg_store: PostgresStore, postgres_url: str
) -> None:
    await create(pg_store, idle("taken"))
    await create(pg_store, idle("blocker"))
    async with row_locked(postgres_url, "blocker"):
        held = asyncio.ensure_future(pg_store.write(write(session=in_a_turn("blocker")[0])))
        await wait_until_async(
            lambda: asyncio.sleep(0, pg_store._queue.empty()), 10, what="the writer took it"
        )
        commits, operations = pg_store.commits, pg_store.operations
        writes = [write(session=idle(f"s{i}"), create=True, history=[user(i)]) for i in range(10)]
        bad = write(session=SessionState(id="taken", agent="x", created_at=T0), create=True)
        writes.insert(4, bad)
        pending = [asyncio.ensure_future(pg_store.write(w)) for w in writes]
        await wait_until_async(
            lambda: asyncio.sleep(0, pg_store._queue.qsize() == 11), 10, what="all queued"
        )
    await held
    results = await asyncio.gather(*pending, return_exceptions=True)

    assert pg_store.commits - commits == 2  # the held write, then all 11 at once
    assert pg_store.operations - operations == 1 + 11
    assert isinstance(results[4], Conflict)
    assert [r for i, r in enumerate(results) if i != 4] == [None] * 10
    for i in range(10):
        loaded = await load(pg_store, f"s{i}")
        assert loaded is not None and loaded[1] == [user(i)]
    taken = await load(pg_store, "taken")
    assert taken is not None and taken[0].agent == "helper"


async def in_one_pg_batch(store: PostgresStore, url: str, writes: list[Write]) -> None:
    """Commit ``writes`` in one group commit: queued while the writer waits on a locked
    row (of the session ``blocker``, created here)."""
    if await store.load_session("blocker") is None:
        await create(store, idle("blocker"))
    async with row_locked(url, "blocker"):
        held = asyncio.ensure_future(store.write(write(session=in_a_turn("blocker")[0])))
        await wait_until_async(
            lambda: asyncio.sleep(0, store._queue.empty()), 10, what="the writer took it"
        )
        commits = store.commits
        pending = [asyncio.ensure_future(store.write(w)) for w in writes]
        await wait_until_async(
            lambda: asyncio.sleep(0, store._queue.qsize() == len(writes)), 10, what="queued"
        )
    await held
    assert await asyncio.gather(*pending) == [None] * len(writes)
    assert store.commits - commits == 2  # the held write, then all the others at once


async def test_postgres_one_group_commit_stores_every_sessions_rows_as_its_write_left_them(
    pg_store: PostgresStore, postgres_url: str
) -> None:
    """A batch sends each statement once over the rows of all its writes (unnested
    arrays): each session's state, history, Steps and calls load back as its write left
    them, new rows and changed ones alike."""
    turns = {f"s{i:02}": in_a_turn(f"s{i:02}") for i in range(12)}
    for sid in turns:
        await create(pg_store, idle(sid))
    writes = [write(session=s, history=h, history_start=0) for s, h in turns.values()]
    await in_one_pg_batch(pg_store, postgres_url, writes)  # new history, Steps and calls
    for state, _ in turns.values():  # the tool's Worker hands it back: both rows change
        handlers.hand_back(state, state.turn.steps[-1].id, 1)  # type: ignore[union-attr]

    await in_one_pg_batch(pg_store, postgres_url, [write(session=s) for s, _ in turns.values()])

    for sid, (state, history) in turns.items():
        loaded = await load(pg_store, sid)
        assert loaded == (state, history)
        assert loaded[0].turn.steps[-1].handed_back == 1  # type: ignore[union-attr]
    listed = {r.id: r.status for r in await rows(pg_store)}  # the fleet's columns too
    assert [listed[sid] for sid in turns] == ["running"] * len(turns)


async def test_postgres_two_writes_of_one_session_in_one_batch_apply_in_order(
    pg_store: PostgresStore, postgres_url: str
) -> None:
    for sid in ("a", "b"):
        await create(pg_store, idle(sid))
    a, history = in_a_turn("a")
    b, _ = in_a_turn("b")

    await in_one_pg_batch(
        pg_store,
        postgres_url,
        [
            write(session=a, history=history, history_start=0),
            write(session=b),
            write(session=idle("a")),
        ],
    )

    assert await load(pg_store, "a") == (idle("a"), history)
    assert await load(pg_store, "b") == (b, [])


async def test_postgres_reads_do_not_queue_behind_commits(
    pg_store: PostgresStore, postgres_url: str
) -> None:
    await create(pg_store, idle("blocker"))
    await create(pg_store, idle("other"), [user(1)])
    async with row_locked(postgres_url, "blocker"):
        held = asyncio.ensure_future(pg_store.write(write(session=in_a_turn("blocker")[0])))
        await wait_until_async(
            lambda: asyncio.sleep(0, pg_store._queue.empty()), 10, what="the writer took it"
        )

        async with asyncio.timeout(5):  # the commit waits on the lock; reads go around it
            loaded = await load(pg_store, "other")
            listed = await rows(pg_store)

        assert not held.done()
    await held
    assert loaded is not None and loaded[1] == [user(1)]
    assert [r.id for r in listed] == ["other", "blocker"]


async def test_postgres_a_connection_lost_during_a_commit_is_commit_unknown(
    pg_store: PostgresStore, postgres_url: str
) -> None:
    await create(pg_store, idle("blocker"))
    assert pg_store._conn is not None
    writer_pid = pg_store._conn.info.backend_pid
    async with row_locked(postgres_url, "blocker"):
        held = asyncio.ensure_future(pg_store.write(write(session=in_a_turn("blocker")[0])))
        await wait_until_async(
            lambda: asyncio.sleep(0, pg_store._queue.empty()), 10, what="the writer took it"
        )
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (writer_pid,))

        with pytest.raises(CommitUnknown):
            await held

    # the store reconnects for the next batch
    await create(pg_store, idle("after"))
    assert [r.id for r in await rows(pg_store)] == ["blocker", "after"]  # by id, newest first


# --- rolling upgrades: what Dex 0.1 stored, read by this version ---------------------------------

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-format-1.json"


def format_1_writes() -> list[Write]:
    """The rows of tests/fixtures/store-format-1.json (made by Dex 0.1.0's own store, before
    records carried a format), as writes of raw JSON text."""
    tables = json.loads(FIXTURE.read_text())["tables"]
    out = [Write(agents=[(a["name"], a["spec"]) for a in tables["agents"]])]
    for s in tables["sessions"]:
        sid = s["id"]
        out.append(
            Write(
                session=SessionRecord(sid, s["agent"], s["created_at"], s["status"], s["state"]),
                create=True,
                history=[h["item"] for h in tables["history"] if h["session_id"] == sid],
            )
        )
        for t in (t for t in tables["turns"] if t["session_id"] == sid):
            out.append(
                Write(
                    session=SessionRecord(
                        sid, s["agent"], s["created_at"], s["status"], s["state"]
                    ),
                    ended_turn=TurnRecord(t["number"], t["status"], t["turn"]),
                )
            )
        for m in (m for m in tables["messages"] if m["session_id"] == sid):
            out.append(
                Write(
                    session=SessionRecord(
                        sid, s["agent"], s["created_at"], s["status"], s["state"]
                    ),
                    message=RememberedMessage(m["message_id"], m["number"]),
                )
            )
    return out


async def test_records_stored_by_dex_0_1_load_and_recover(store: Store) -> None:
    for w in format_1_writes():
        await store.write(w)

    assert await load_agents(store) == [SPEC]
    running = await load(store, "running")
    assert running is not None
    assert running[0].status == SessionStatus.RUNNING
    assert [s.status.value for s in running[0].turn.steps] == ["succeeded", "running"]  # type: ignore[union-attr]
    assert running[1] == in_a_turn("running")[1]
    done = await load(store, "done")
    assert done is not None and done[1] == [UserItem(text="hello"), AssistantItem(text="hi")]
    turn = await load_turn(store, "done", 1)
    assert turn is not None and turn.text == "hi"
    assert await store.find_message("done", "m-9") == RememberedMessage("m-9", 1)

    # a node starting on these rows recovers them as a restart does
    domain = Sessions(store, Dispatcher(10.0))
    assert await domain.start() == 1  # the attempt that was running fails as NOT_COMPLETED
    snapshot = await domain.reads.snapshot("running")
    [call] = snapshot["tool_calls"]
    # its retry window (30 min from 1970's T0) is long past: the call fails for good
    assert (call["name"], call["status"]) == ("lookup", "failed")
    rewritten = await store.load_session("running")
    assert rewritten is not None and rewritten.state.startswith('{"format":2,')
    # its rows now: the model call, the failed tool Step, the model call that reads the failure
    assert [orjson.loads(s)["status"] for s in rewritten.steps] == ["succeeded", "failed", "queued"]
    await domain.stop()


async def test_sqlite_a_writer_that_dies_alone_leaves_the_store_refusing_every_call(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "dex.sqlite3")
    lost: list[bool] = []
    heard = asyncio.Event()

    def on_lost() -> None:
        lost.append(True)
        heard.set()

    store.on_lost = on_lost
    await store.open()
    try:
        await create(store, idle("s1"))
        assert store.writer_pid is not None
        os.kill(store.writer_pid, signal.SIGKILL)

        async with asyncio.timeout(10):
            await heard.wait()  # the store hears its writer died
        with pytest.raises(StorageError, match="writer process died"):
            await load(store, "s1")
        with pytest.raises(StorageError):
            await create(store, idle("s2"))
        assert lost == [True]  # once
    finally:
        await store.close()

    again = SqliteStore(tmp_path / "dex.sqlite3")  # a restart finds what was committed
    await again.open()
    try:
        assert await load(again, "s1") is not None
        assert await load(again, "s2") is None
    finally:
        await again.close()


async def test_sqlite_waits_for_the_lock_a_dead_node_left_to_its_dying_writer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dex.sqlite3"
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    # another process holds the lock, the file naming a node that is gone: a node's
    # writer, killed with it a moment ago and not dead yet
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path) + '.lock'!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"os.write(fd, b'{dead.pid}\\n')\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
        store = SqliteStore(path)
        opening = asyncio.ensure_future(store.open())
        await asyncio.sleep(0)  # it tried the lock once
        assert not opening.done()  # and waits, where a live holder is refused at once

        assert holder.stdin is not None
        holder.stdin.close()  # the writer is dead: its lock is free
        async with asyncio.timeout(10):
            await opening
        await create(store, idle("s1"))
        await store.close()
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


async def test_model_limits_set_at_run_time_are_stored_and_cleared(store: Store) -> None:
    await store.write(Write(limits=[("g", '{"rpm":60.0}'), ("h", '{"concurrency":2}')]))
    await store.write(Write(limits=[("g", '{"rpm":30.0}'), ("h", None)]))
    assert await store.load_limits() == [("g", '{"rpm":30.0}')]


async def test_tenant_budgets_are_stored_replaced_and_deleted(store: Store) -> None:
    await store.write(Write(tenant_budgets=[("acme", '{"a":1}'), ("bolt", '{"b":2}')]))
    await store.write(Write(tenant_budgets=[("acme", '{"a":3}'), ("bolt", None)]))
    assert await store.load_tenant_budgets() == [("acme", '{"a":3}')]


async def test_a_tenant_s_usage_adds_up_by_day_over_writes_committed_together(
    store: Store,
) -> None:
    sessions = [idle(f"s{i}") for i in range(6)]
    for state in sessions:
        await create(store, state)
    days = ["2026-11-30", "2026-12-01", "2026-12-01", "2026-12-02", "2026-12-02", "2026-12-02"]

    def charged(i: int, tenant: str) -> Write:
        w = write(session=sessions[i])
        w.tenant_usage = TenantUsage(tenant, days[i], 100 * i, i, 0.25 * i)
        return w

    # committed at once: a backend that runs one statement over many writes adds them up
    await asyncio.gather(*(store.write(charged(i, "acme")) for i in range(6)))
    await store.write(charged(5, "bolt"))
    await store.write(charged(4, "acme"))

    assert await store.tenant_usage("2026-12-01", ["acme"]) == [
        TenantUsage("acme", "2026-12-01", 300, 3, 0.75, 2),
        TenantUsage("acme", "2026-12-02", 1_600, 16, 4.0, 4),
    ]
    assert [(u.tenant, u.day) for u in await store.tenant_usage("2026-12-02")] == [
        ("acme", "2026-12-02"),
        ("bolt", "2026-12-02"),
    ]
    assert await store.tenant_usage("2026-12-01", []) == []


async def test_postgres_nodes_exchange_their_demand_and_stale_reports_are_left_out(
    pg_store: PostgresStore,
) -> None:
    assert await pg_store.exchange_demand("a", {"g": 3, "h": 0}, at=100.0, since=90.0) == []
    assert await pg_store.exchange_demand("old", {"g": 50}, at=80.0, since=70.0) == [
        ("a", "g", 3),
        ("a", "h", 0),
    ]
    seen = await pg_store.exchange_demand("b", {"g": 1}, at=101.0, since=91.0)
    assert sorted(seen or []) == [("a", "g", 3), ("a", "h", 0)]  # not its own, nor the stale
    assert await pg_store.exchange_demand("a", {"g": 4}, at=102.0, since=92.0) == [("b", "g", 1)]


async def test_sqlite_has_no_cluster_to_share_demand_with(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "dex.sqlite3")
    await store.open()
    try:
        assert await store.exchange_demand("a", {"g": 1}, at=1.0, since=0.0) is None
    finally:
        await store.close()

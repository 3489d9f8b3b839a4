"""The embedded SQLite store: WAL, ``synchronous=FULL``, group commit.

One thread owns the connection. Callers on the event loop queue operations;
the thread takes everything queued, runs each operation inside its own
savepoint, and commits once. A commit is durable before any caller hears back,
so batching buys speed without trading durability.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from dex.errors import Conflict, StorageError
from dex.server.engine.state import SessionState, Turn
from dex.server.store.base import SessionRow, Store, Write, migrations
from dex.wire import ITEM, ITEMS, AgentSpec, Item

log = logging.getLogger("dex.store")
T = TypeVar("T")
Op = Callable[[sqlite3.Connection], Any]


class SqliteStore(Store):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[tuple[Op, asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.commits = 0
        """How many transactions committed: with ``operations``, shows how well commits group."""
        self.operations = 0

    # --- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self._queue = queue.SimpleQueue()  # nothing left over from an earlier open
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="dex-sqlite", daemon=True
        )
        self._thread.start()
        try:
            await ready
            await self._call(_migrate)
        except BaseException:
            await self.close()  # a store that failed to open refuses calls, never hangs them
            raise

    async def close(self) -> None:
        if self._thread is not None:
            # Refuse new calls at once: one queued behind the stop would never be answered.
            thread, self._thread = self._thread, None
            self._queue.put(None)
            await asyncio.to_thread(thread.join)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    # --- the writer thread ------------------------------------------------------

    def _run(self, ready: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            conn = self._connect()
        except sqlite3.Error as e:
            loop.call_soon_threadsafe(
                ready.set_exception, StorageError(f"cannot open {self.path}: {e}")
            )
            return
        loop.call_soon_threadsafe(ready.set_result, None)
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            loop.call_soon_threadsafe(_deliver, self._commit(conn, batch))
        conn.close()

    def _commit(
        self, conn: sqlite3.Connection, batch: list[tuple[Op, asyncio.Future[Any]]]
    ) -> list[tuple[asyncio.Future[Any], Any, BaseException | None]]:
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN")
            for op, fut in batch:
                conn.execute("SAVEPOINT op")
                try:
                    value = op(conn)
                except Exception as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((fut, None, _translate(e)))
                else:
                    conn.execute("RELEASE op")
                    results.append((fut, value, None))
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("commit failed", extra={"action": "store.commit_failed", "error": str(e)})
            error = StorageError("the store could not commit; nothing was written", retryable=True)
            return [(fut, None, error) for _, fut in batch]
        self.commits += 1
        self.operations += len(batch)
        return results

    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._loop is None or self._thread is None:
            raise StorageError("the store is not open")
        fut: asyncio.Future[T] = self._loop.create_future()
        self._queue.put((op, fut))
        return await fut

    # --- the interface --------------------------------------------------------------

    async def write(self, write: Write) -> None:
        await self._call(lambda conn: _write(conn, write))

    async def load_session(self, session_id: str) -> tuple[SessionState, list[Item]] | None:
        def op(conn: sqlite3.Connection) -> tuple[SessionState, list[Item]] | None:
            row = conn.execute("SELECT state FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            items = conn.execute(
                "SELECT item FROM history WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
            history = ITEMS.validate_python([orjson.loads(i[0]) for i in items])
            return SessionState.model_validate_json(row[0]), history

        return await self._call(op)

    async def list_sessions(self, limit: int, after: str | None) -> list[SessionRow]:
        def op(conn: sqlite3.Connection) -> list[SessionRow]:
            rows = conn.execute(
                "SELECT id, agent, created_at, status FROM sessions WHERE id > ? "
                "ORDER BY id LIMIT ?",
                (after or "", limit),
            ).fetchall()
            return [SessionRow(*r) for r in rows]

        return await self._call(op)

    async def running_sessions(self) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT id FROM sessions WHERE status <> 'idle'").fetchall()
            return [r[0] for r in rows]

        return await self._call(op)

    async def load_turn(self, session_id: str, number: int) -> Turn | None:
        def op(conn: sqlite3.Connection) -> Turn | None:
            row = conn.execute(
                "SELECT turn FROM turns WHERE session_id = ? AND number = ?", (session_id, number)
            ).fetchone()
            return Turn.model_validate_json(row[0]) if row else None

        return await self._call(op)

    async def load_turns(self, session_id: str) -> list[Turn]:
        def op(conn: sqlite3.Connection) -> list[Turn]:
            rows = conn.execute(
                "SELECT turn FROM turns WHERE session_id = ? ORDER BY number", (session_id,)
            ).fetchall()
            return [Turn.model_validate_json(r[0]) for r in rows]

        return await self._call(op)

    async def find_message(self, session_id: str, message_id: str) -> int | None:
        def op(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT number FROM messages WHERE session_id = ? AND message_id = ?",
                (session_id, message_id),
            ).fetchone()
            return int(row[0]) if row else None

        return await self._call(op)

    async def load_agents(self) -> list[AgentSpec]:
        def op(conn: sqlite3.Connection) -> list[AgentSpec]:
            rows = conn.execute("SELECT spec FROM agents ORDER BY name").fetchall()
            return [AgentSpec.model_validate_json(r[0]) for r in rows]

        return await self._call(op)

    async def schema_version(self) -> int:
        return await self._call(_version)


def _deliver(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, error in results:
        if fut.done():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)


def _translate(e: Exception) -> Exception:
    """A driver error as a Dex error whose message names no table, column or statement
    (the driver's own words go to the log)."""
    if isinstance(e, sqlite3.IntegrityError):
        log.warning("write refused", extra={"action": "store.conflict", "error": str(e)})
        return Conflict("the write conflicts with what is stored")
    if isinstance(e, sqlite3.Error):
        log.error("write failed", extra={"action": "store.error", "error": str(e)})
        return StorageError("the store could not complete the operation", retryable=True)
    return e


def _version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def _migrate(conn: sqlite3.Connection) -> None:
    current = _version(conn)
    for number, sql in migrations():
        if number <= current:
            continue
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(number),),
        )


def _write(conn: sqlite3.Connection, w: Write) -> None:
    now = time.time()
    for spec in w.agents:
        conn.execute(
            "INSERT INTO agents (name, spec, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
            "updated_at = excluded.updated_at",
            (spec.name, spec.model_dump_json(), now),
        )
    s = w.session
    if s is not None:
        if w.create:
            try:
                conn.execute(
                    "INSERT INTO sessions (id, agent, created_at, status, state) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (s.id, s.agent, s.created_at, s.status.value, s.model_dump_json()),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"session {s.id!r} already exists", session_id=s.id) from None
        else:
            conn.execute(
                "UPDATE sessions SET status = ?, state = ? WHERE id = ?",
                (s.status.value, s.model_dump_json(), s.id),
            )
        if w.message is not None:
            conn.execute(
                "INSERT INTO messages (session_id, message_id, number) VALUES (?, ?, ?)",
                (s.id, w.message[0], w.message[1]),
            )
        if w.history:
            conn.executemany(
                "INSERT INTO history (session_id, seq, item) VALUES (?, ?, ?)",
                [
                    (s.id, w.history_start + i, ITEM.dump_json(item).decode())
                    for i, item in enumerate(w.history)
                ],
            )
        if w.ended_turn is not None:
            conn.execute(
                "INSERT INTO turns (session_id, number, status, turn) VALUES (?, ?, ?, ?)",
                (
                    s.id,
                    w.ended_turn.number,
                    w.ended_turn.status.value,
                    w.ended_turn.model_dump_json(),
                ),
            )
        if w.updated_turn is not None:
            conn.execute(
                "UPDATE turns SET status = ?, turn = ? WHERE session_id = ? AND number = ?",
                (
                    w.updated_turn.status.value,
                    w.updated_turn.model_dump_json(),
                    s.id,
                    w.updated_turn.number,
                ),
            )

"""The SQL both backends run, named once, and the store built on it.

A backend supplies an executor and a few dialect hooks: ``_commit_write`` (its
group commit), ``_read`` (queries in one snapshot), connecting and migrations. The
queries use ``?`` placeholders; a dialect that wants another style converts them.
"""

from __future__ import annotations

import functools
import time
from abc import abstractmethod
from typing import Any

from dex.server.store.base import SessionRow, Store, Write

Statement = tuple[str, list[tuple[Any, ...]]]
"""A query and its rows of parameters (one row, or many for ``executemany``)."""
Query = tuple[str, tuple[Any, ...]]

UPSERT_AGENT = (
    "INSERT INTO agents (name, spec, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at"
)
INSERT_SESSION = (
    "INSERT INTO sessions (id, agent, created_at, status, state) VALUES (?, ?, ?, ?, ?)"
)
UPDATE_SESSION = "UPDATE sessions SET status = ?, state = ? WHERE id = ?"
INSERT_MESSAGE = "INSERT INTO messages (session_id, message_id, number) VALUES (?, ?, ?)"
INSERT_HISTORY = "INSERT INTO history (session_id, seq, item) VALUES "
"""Followed by one ``(?, ?, ?)`` per item: one statement per write, not one per item."""
HISTORY_CHUNK = 500
"""Items per ``INSERT``: well under SQLite's limit on parameters in one statement."""
INSERT_TURN = "INSERT INTO turns (session_id, number, status, turn) VALUES (?, ?, ?, ?)"
UPDATE_TURN = "UPDATE turns SET status = ?, turn = ? WHERE session_id = ? AND number = ?"

SESSION_STATE = "SELECT state FROM sessions WHERE id = ?"
SESSION_HISTORY = "SELECT item FROM history WHERE session_id = ? ORDER BY seq"
LIST_SESSIONS = (
    "SELECT id, agent, created_at, status FROM sessions WHERE id > ? ORDER BY id LIMIT ?"
)
RUNNING_SESSIONS = "SELECT id FROM sessions WHERE status <> 'idle'"
"""No ``ORDER BY``: SQLite would walk the primary key (every session) to return them in
order instead of the partial index of the few in a turn; they are sorted after."""
LOAD_TURN = "SELECT turn FROM turns WHERE session_id = ? AND number = ?"
LOAD_TURNS = "SELECT turn FROM turns WHERE session_id = ? ORDER BY number"
FIND_MESSAGE = "SELECT number FROM messages WHERE session_id = ? AND message_id = ?"
LOAD_AGENTS = "SELECT spec FROM agents ORDER BY name"

VERSION = "SELECT value FROM meta WHERE key = 'schema_version'"
SET_VERSION = (
    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


def statements(w: Write, now: float | None = None) -> list[Statement]:
    """What one ``Write`` executes, in order."""
    out: list[Statement] = []
    if w.agents:
        at = time.time() if now is None else now
        out.append((UPSERT_AGENT, [(name, spec, at) for name, spec in w.agents]))
    s = w.session
    if s is None:
        return out
    if w.create:
        out.append((INSERT_SESSION, [(s.id, s.agent, s.created_at, s.status, s.state)]))
    else:
        out.append((UPDATE_SESSION, [(s.status, s.state, s.id)]))
    if w.message is not None:
        out.append((INSERT_MESSAGE, [(s.id, w.message[0], w.message[1])]))
    for first in range(0, len(w.history), HISTORY_CHUNK):
        chunk = w.history[first : first + HISTORY_CHUNK]
        start = w.history_start + first
        params = tuple(v for i, item in enumerate(chunk) for v in (s.id, start + i, item))
        out.append((_rows(INSERT_HISTORY, 3, len(chunk)), [params]))
    if w.ended_turn is not None:
        t = w.ended_turn
        out.append((INSERT_TURN, [(s.id, t.number, t.status, t.turn)]))
    if w.updated_turn is not None:
        t = w.updated_turn
        out.append((UPDATE_TURN, [(t.status, t.turn, s.id, t.number)]))
    return out


@functools.cache
def _rows(head: str, width: int, count: int) -> str:
    """``head`` followed by ``count`` groups of ``width`` placeholders."""
    group = "(" + ", ".join("?" * width) + ")"
    return head + ", ".join([group] * count)


class SqlStore(Store):
    """The ``Store`` interface over the queries above; backends add the executor."""

    @abstractmethod
    async def _commit_write(self, statements: list[Statement]) -> None:
        """Run one write's statements in the next group commit; it succeeds or fails alone."""

    @abstractmethod
    async def _read(self, queries: list[Query]) -> list[list[tuple[Any, ...]]]:
        """Run ``queries`` in one snapshot; each one's rows."""

    async def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        [rows] = await self._read([(sql, params)])
        return rows

    async def write(self, write: Write) -> None:
        await self._commit_write(statements(write))

    async def load_session(self, session_id: str) -> tuple[str, list[str]] | None:
        state, history = await self._read(
            [(SESSION_STATE, (session_id,)), (SESSION_HISTORY, (session_id,))]
        )
        if not state:
            return None
        return str(state[0][0]), [str(r[0]) for r in history]

    async def list_sessions(self, limit: int, after: str | None) -> list[SessionRow]:
        rows = await self._rows(LIST_SESSIONS, after or "", limit)
        return [SessionRow(str(r[0]), str(r[1]), float(r[2]), str(r[3])) for r in rows]

    async def running_sessions(self) -> list[str]:
        return sorted(str(r[0]) for r in await self._rows(RUNNING_SESSIONS))

    async def load_turn(self, session_id: str, number: int) -> str | None:
        rows = await self._rows(LOAD_TURN, session_id, number)
        return str(rows[0][0]) if rows else None

    async def load_turns(self, session_id: str) -> list[str]:
        return [str(r[0]) for r in await self._rows(LOAD_TURNS, session_id)]

    async def find_message(self, session_id: str, message_id: str) -> int | None:
        rows = await self._rows(FIND_MESSAGE, session_id, message_id)
        return int(rows[0][0]) if rows else None

    async def load_agents(self) -> list[str]:
        return [str(r[0]) for r in await self._rows(LOAD_AGENTS)]

"""The SQL both backends run, named once, and the store built on it.

A backend supplies an executor and a few dialect hooks: ``_commit_write`` (its
group commit), ``_read`` (queries in one snapshot), connecting and migrations. The
queries use ``?`` placeholders; a dialect that wants another style converts them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from abc import abstractmethod
from typing import Any

from dex.server.store.base import (
    IN_A_TURN,
    SAID_CHARS,
    ListedSession,
    RememberedMessage,
    Said,
    SessionQuery,
    SessionRow,
    Store,
    StoreCounters,
    StoredSession,
    StoredTurn,
    TenantUsage,
    Write,
)

Statement = tuple[str, list[tuple[Any, ...]]]
"""A query and its rows of parameters (one row, or many for ``executemany``)."""
Query = tuple[str, tuple[Any, ...]]

UPSERT_AGENT = (
    "INSERT INTO agents (name, spec, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at"
)
INSERT_SESSION = (
    "INSERT INTO sessions (id, agent, created_at, status, turn, state, updated_at, "
    "waiting_since, outcome_unknown, tenant, input_tokens, output_tokens, cost_usd) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
UPDATE_SESSION = (
    "UPDATE sessions SET status = ?, turn = ?, state = ?, updated_at = ?, waiting_since = ?, "
    "outcome_unknown = ?, input_tokens = ?, output_tokens = ?, cost_usd = ? WHERE id = ?"
)
INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, message_id, number, outcome, interrupted) "
    "VALUES (?, ?, ?, ?, ?)"
)
INSERT_HISTORY = "INSERT INTO history (session_id, seq, item) VALUES (?, ?, ?)"
UPSERT_STEP = (
    "INSERT INTO steps (session_id, turn, seq, step) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session_id, turn, seq) DO UPDATE SET step = excluded.step"
)
UPSERT_CALL = (
    "INSERT INTO calls (session_id, turn, seq, call) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session_id, turn, seq) DO UPDATE SET call = excluded.call"
)
INSERT_TURN = "INSERT INTO turns (session_id, number, status, turn) VALUES (?, ?, ?, ?)"

SESSION_STATE = "SELECT state FROM sessions WHERE id = ?"
_CURRENT = "session_id = ? AND turn = (SELECT turn FROM sessions WHERE id = ?) ORDER BY seq"
SESSION_STEPS = "SELECT step FROM steps WHERE " + _CURRENT
SESSION_CALLS = "SELECT call FROM calls WHERE " + _CURRENT
SESSION_HISTORY = "SELECT item FROM history WHERE session_id = ? ORDER BY seq"
SESSION_ROW = (
    "id, agent, created_at, status, updated_at, waiting_since, outcome_unknown, tenant, "
    "input_tokens, output_tokens, cost_usd"
)
ORDER_COLUMN = {"created": "created_at", "updated": "updated_at"}
ITEM_FIELD = {"sqlite": "json_extract(item, '$.{}')", "postgresql": "(item::json ->> '{}')"}
"""A text field of a history item (its JSON), in each dialect."""
LAST_MESSAGE = (
    "(SELECT {type} || ':' || substr({text}, 1, {chars}) FROM history "
    "WHERE session_id = sessions.id AND ({type} = 'user' OR ({type} = 'assistant' AND "
    "{text} <> '')) ORDER BY seq DESC LIMIT 1)"
)
"""A session's last message as ``role:text``: its history read backwards by the primary
key, from the end to the latest user message or assistant text (the current turn's user
message at the farthest)."""
RUNNING_SESSIONS = (
    "SELECT id FROM sessions WHERE status IN ("
    + ", ".join(f"'{status}'" for status in IN_A_TURN)
    + ")"
)
"""No ``ORDER BY``: SQLite would walk the primary key (every session) to return them in
order instead of the index of the few in a turn; they are sorted after."""
WAITING_SESSIONS = (
    "SELECT id, waiting_since FROM sessions WHERE waiting_since IS NOT NULL{}{} "
    "ORDER BY waiting_since DESC, id DESC LIMIT ?"
)
LOAD_TURN = "SELECT turn FROM turns WHERE session_id = ? AND number = ?"
TURN_STEPS = "SELECT step FROM steps WHERE session_id = ? AND turn = ? ORDER BY seq"
TURN_CALLS = "SELECT call FROM calls WHERE session_id = ? AND turn = ? ORDER BY seq"
LOAD_TURNS = "SELECT number, turn FROM turns WHERE session_id = ? ORDER BY number"
ALL_STEPS = "SELECT turn, step FROM steps WHERE session_id = ? ORDER BY turn, seq"
ALL_CALLS = "SELECT turn, call FROM calls WHERE session_id = ? ORDER BY turn, seq"
FIND_MESSAGE = (
    "SELECT number, outcome, interrupted FROM messages WHERE session_id = ? AND message_id = ?"
)
LOAD_AGENTS = "SELECT spec FROM agents ORDER BY name"
UPSERT_LIMIT = (
    "INSERT INTO model_limits (grp, spec, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (grp) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at"
)
DELETE_LIMIT = "DELETE FROM model_limits WHERE grp = ?"
LOAD_LIMITS = "SELECT grp, spec FROM model_limits ORDER BY grp"
UPSERT_TENANT_BUDGET = (
    "INSERT INTO tenant_budgets (tenant, spec, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (tenant) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at"
)
DELETE_TENANT_BUDGET = "DELETE FROM tenant_budgets WHERE tenant = ?"
LOAD_TENANT_BUDGETS = "SELECT tenant, spec FROM tenant_budgets ORDER BY tenant"
ADD_TENANT_USAGE = (
    "INSERT INTO tenant_usage (tenant, day, input_tokens, output_tokens, cost_usd, calls) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, day) DO UPDATE SET "
    "input_tokens = tenant_usage.input_tokens + excluded.input_tokens, "
    "output_tokens = tenant_usage.output_tokens + excluded.output_tokens, "
    "cost_usd = tenant_usage.cost_usd + excluded.cost_usd, "
    "calls = tenant_usage.calls + excluded.calls"
)
"""Add to a tenant's day: a backend that runs the rows of many writes at once adds them up
by (tenant, day) first, in that order (``add_up``), so that two nodes' batches lock the
rows they share in one order."""
TENANT_USAGE = (
    "SELECT tenant, day, input_tokens, output_tokens, cost_usd, calls FROM tenant_usage "
    "WHERE day >= ?{} ORDER BY tenant, day"
)

VERSION = "SELECT value FROM meta WHERE key = 'schema_version'"
SET_VERSION = (
    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


def statements(w: Write, now: float | None = None) -> list[Statement]:
    """What one ``Write`` executes, in order. Each statement's text is fixed (its rows
    vary), so a backend may run the same statement of many writes as one batch."""
    out: list[Statement] = []
    if w.agents:
        at = time.time() if now is None else now
        out.append((UPSERT_AGENT, [(name, spec, at) for name, spec in w.agents]))
    if w.limits:
        at = time.time() if now is None else now
        if set_ := [(group, spec, at) for group, spec in w.limits if spec is not None]:
            out.append((UPSERT_LIMIT, set_))
        if cleared := [(group,) for group, spec in w.limits if spec is None]:
            out.append((DELETE_LIMIT, cleared))
    if w.tenant_budgets:
        at = time.time() if now is None else now
        if set_ := [(t, spec, at) for t, spec in w.tenant_budgets if spec is not None]:
            out.append((UPSERT_TENANT_BUDGET, set_))
        if cleared := [(t,) for t, spec in w.tenant_budgets if spec is None]:
            out.append((DELETE_TENANT_BUDGET, cleared))
    s = w.session
    if s is None:
        return out
    updated_at = s.created_at if s.updated_at is None else s.updated_at
    if w.create:
        row = (s.id, s.agent, s.created_at, s.status, s.turn, s.state, updated_at)
        columns = (s.waiting_since, s.outcome_unknown, s.tenant, *s.usage)
        out.append((INSERT_SESSION, [(*row, *columns)]))
    else:
        fleet = (updated_at, s.waiting_since, s.outcome_unknown, *s.usage)
        out.append((UPDATE_SESSION, [(s.status, s.turn, s.state, *fleet, s.id)]))
    if w.message is not None:
        out.append((INSERT_MESSAGE, [(s.id, *w.message)]))
    if w.history:
        start = w.history_start
        out.append((INSERT_HISTORY, [(s.id, start + i, item) for i, item in enumerate(w.history)]))
    if w.steps:
        out.append((UPSERT_STEP, [(s.id, r.turn, r.seq, r.json) for r in w.steps]))
    if w.calls:
        out.append((UPSERT_CALL, [(s.id, r.turn, r.seq, r.json) for r in w.calls]))
    if w.archived_turns:
        out.append((INSERT_TURN, [(s.id, t.number, t.status, t.turn) for t in w.archived_turns]))
    if w.ended_turn is not None:
        t = w.ended_turn
        out.append((INSERT_TURN, [(s.id, t.number, t.status, t.turn)]))
    if w.tenant_usage is not None:
        out.append((ADD_TENANT_USAGE, [tuple(w.tenant_usage)]))
    return out


def add_up(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``ADD_TENANT_USAGE``'s rows of many writes as one row per (tenant, day), in order."""
    summed: dict[tuple[str, str], list[Any]] = {}
    for tenant, day, *counts in rows:
        found = summed.get((tenant, day))
        if found is None:
            summed[(tenant, day)] = list(counts)
        else:
            for i, n in enumerate(counts):
                found[i] += n
    return [(*key, *summed[key]) for key in sorted(summed)]


def list_sessions(q: SessionQuery, dialect: str = "sqlite") -> Query:
    """The query for one page of the session list. Each filter alone, in either order,
    reads a range of one index (migrations sqlite/0003, postgresql/0004), so a page costs
    the same however many sessions are stored; filters combined read one of their indexes
    and skip what the others refuse. ``q.last_message`` adds a column, ``LAST_MESSAGE``
    (``dialect`` says how to read a history item's fields)."""
    column = ORDER_COLUMN[q.order]
    where: list[str] = []
    params: list[Any] = []
    for clause, value in (
        ("agent = ?", q.agent),
        ("status = ?", q.status),
        ("tenant = ?", q.tenant),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    if q.outcome_unknown:
        where.append("outcome_unknown > 0")  # as the partial index says: it applies
    keyset = q.before
    for name, (since, before) in (("created_at", q.created), ("updated_at", q.updated)):
        if since is not None:
            where.append(f"{name} >= ?")
            params.append(since)
        if before is not None and name == column and keyset is not None:
            # One upper bound on the ordered column, the tighter: with two, a backend may
            # read from the looser one and skip every row of the earlier pages.
            if keyset[0] < before:
                continue
            keyset = None
        if before is not None:
            where.append(f"{name} < ?")
            params.append(before)
    if keyset is not None:
        where.append(f"({column}, id) < (?, ?)")
        params.extend(keyset)
    condition = " WHERE " + " AND ".join(where) if where else ""
    columns = SESSION_ROW
    if q.last_message:
        field = ITEM_FIELD[dialect]
        said = LAST_MESSAGE.format(
            type=field.format("type"), text=field.format("text"), chars=SAID_CHARS
        )
        columns += ", " + said
    sql = f"SELECT {columns} FROM sessions{condition} ORDER BY {column} DESC, id DESC LIMIT ?"
    return sql, (*params, q.limit)


def waiting_sessions(
    limit: int, before: tuple[float, str] | None, tenant: str | None = None
) -> Query:
    """The inbox's sessions: one range of ``sessions_waiting``, or with ``tenant`` of
    ``sessions_tenant_waiting``."""
    of_tenant = "" if tenant is None else " AND tenant = ?"
    first = () if tenant is None else (tenant,)
    if before is None:
        return WAITING_SESSIONS.format(of_tenant, ""), (*first, limit)
    keyset = " AND (waiting_since, id) < (?, ?)"
    return WAITING_SESSIONS.format(of_tenant, keyset), (*first, *before, limit)


def _row(r: tuple[Any, ...], last_message: bool) -> SessionRow:
    fields = (
        str(r[0]),
        str(r[1]),
        float(r[2]),
        str(r[3]),
        float(r[4]),
        None if r[5] is None else float(r[5]),
        int(r[6]),
        None if r[7] is None else str(r[7]),
        {"input_tokens": int(r[8]), "output_tokens": int(r[9]), "cost_usd": float(r[10])},
    )
    if not last_message:
        return SessionRow(*fields)
    said = None
    if r[11] is not None:
        role, _, text = str(r[11]).partition(":")
        said = Said(role, text)
    return ListedSession(*fields, last_message=said)


def _texts(rows: list[tuple[Any, ...]]) -> list[str]:
    return [str(r[0]) for r in rows]


class SqlStore(Store):
    """The ``Store`` interface over the queries above; backends add the executor."""

    # What ``counters`` reports: ``StoreCounters`` says what each one counts.
    commits = 0
    operations = 0
    busy_seconds = 0.0
    commit_failures = 0
    """Counted by the SQLite backend; the PostgreSQL backend does not count them (it stays 0)."""
    bytes_written = 0
    """Characters of JSON committed by ``write``: over Steps, what a Step costs the disk."""
    dialect = "sqlite"
    """Which of ``ITEM_FIELD`` reads a JSON field in this backend's SQL."""

    @abstractmethod
    def _commit_write(
        self, statements: list[Statement], session_id: str | None
    ) -> asyncio.Future[None]:
        """Queue one write's statements (of ``session_id``'s, or of no session) for the
        next group commit (it succeeds or fails alone); the future resolves once it is
        durable."""

    @abstractmethod
    async def _read(self, queries: list[Query]) -> list[list[tuple[Any, ...]]]:
        """Run ``queries`` in one snapshot; each one's rows."""

    async def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        [rows] = await self._read([(sql, params)])
        return rows

    def counters(self) -> StoreCounters:
        return StoreCounters(
            commits=self.commits,
            operations=self.operations,
            busy_seconds=self.busy_seconds,
            commit_failures=self.commit_failures,
            bytes_written=self.bytes_written,
        )

    def submit(self, write: Write) -> asyncio.Future[None]:
        session = write.session
        done = self._commit_write(statements(write), None if session is None else session.id)
        done.add_done_callback(functools.partial(self._count, write.size()))
        return done

    def _count(self, size: int, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.bytes_written += size

    async def load_session(self, session_id: str) -> StoredSession | None:
        state, steps, calls, history = await self._read(
            [
                (SESSION_STATE, (session_id,)),
                (SESSION_STEPS, (session_id, session_id)),
                (SESSION_CALLS, (session_id, session_id)),
                (SESSION_HISTORY, (session_id,)),
            ]
        )
        if not state:
            return None
        return StoredSession(str(state[0][0]), _texts(steps), _texts(calls), _texts(history))

    async def list_sessions(self, query: SessionQuery) -> list[SessionRow]:
        [rows] = await self._read([list_sessions(query, self.dialect)])
        return [_row(r, query.last_message) for r in rows]

    async def waiting_sessions(
        self, limit: int, before: tuple[float, str] | None, tenant: str | None = None
    ) -> list[tuple[str, float]]:
        [rows] = await self._read([waiting_sessions(limit, before, tenant)])
        return [(str(r[0]), float(r[1])) for r in rows]

    async def running_sessions(self) -> list[str]:
        return sorted(str(r[0]) for r in await self._rows(RUNNING_SESSIONS))

    async def load_turn(self, session_id: str, number: int) -> StoredTurn | None:
        turn, steps, calls = await self._read(
            [
                (LOAD_TURN, (session_id, number)),
                (TURN_STEPS, (session_id, number)),
                (TURN_CALLS, (session_id, number)),
            ]
        )
        if not turn:
            return None
        return StoredTurn(str(turn[0][0]), _texts(steps), _texts(calls))

    async def load_turns(self, session_id: str) -> list[StoredTurn]:
        turns, steps, calls = await self._read(
            [
                (LOAD_TURNS, (session_id,)),
                (ALL_STEPS, (session_id,)),
                (ALL_CALLS, (session_id,)),
            ]
        )
        by_turn: dict[int, tuple[list[str], list[str]]] = {int(r[0]): ([], []) for r in turns}
        for rows, which in ((steps, 0), (calls, 1)):
            for number, text in rows:
                found = by_turn.get(int(number))
                if found is not None:  # the current turn's rows are not archived yet
                    found[which].append(str(text))
        return [StoredTurn(str(t), *by_turn[int(n)]) for n, t in turns]

    async def find_message(self, session_id: str, message_id: str) -> RememberedMessage | None:
        rows = await self._rows(FIND_MESSAGE, session_id, message_id)
        if not rows:
            return None
        number, outcome, interrupted = rows[0]
        return RememberedMessage(
            message_id,
            int(number),
            None if outcome is None else str(outcome),
            None if interrupted is None else int(interrupted),
        )

    async def load_agents(self) -> list[str]:
        return [str(r[0]) for r in await self._rows(LOAD_AGENTS)]

    async def load_limits(self) -> list[tuple[str, str]]:
        return [(str(g), str(spec)) for g, spec in await self._rows(LOAD_LIMITS)]

    async def load_tenant_budgets(self) -> list[tuple[str, str]]:
        return [(str(t), str(spec)) for t, spec in await self._rows(LOAD_TENANT_BUDGETS)]

    async def tenant_usage(
        self, since_day: str, tenants: list[str] | None = None
    ) -> list[TenantUsage]:
        if tenants is not None and not tenants:
            return []
        only = "" if tenants is None else f" AND tenant IN ({', '.join('?' * len(tenants))})"
        rows = await self._rows(TENANT_USAGE.format(only), since_day, *(tenants or []))
        return [
            TenantUsage(str(t), str(d), int(i), int(o), float(c), int(n))
            for t, d, i, o, c, n in rows
        ]

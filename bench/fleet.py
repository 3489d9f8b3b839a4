"""The fleet view's cost per page at 10,000 and 100,000 sessions, SQLite beside PostgreSQL.

    .venv/bin/python -m bench.fleet                    # 10k and 100k sessions, both stores
    .venv/bin/python -m bench.fleet --sessions 1000 10000 --no-postgres
    .venv/bin/python -m bench.fleet --postgres postgresql://postgres@127.0.0.1:5432/postgres

Each size gets a fresh store filled with sessions as the domain writes them (ten agents;
about 2 % in a turn, 1 % waiting for a person, 5 % whose last turn failed, 1 % with an
unknown outcome; created over 30 days), inserted in bulk with the store's own statements.
Then each query of the session list (``GET /v1/sessions``) and of the inbox is timed
through the ``Store`` interface: its first page and a deep one (a cursor about nine tenths
of the way in), 100 sessions a page, the fastest of 30 tries (the median moves with
whatever else runs on a shared machine). A page whose cost does not grow with the
sessions stored reads the same at both sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.state import SessionState, TurnStatus
from dex.server.store import sql
from dex.server.store.base import SessionQuery, SessionRow, Store
from dex.server.store.postgres import PostgresStore, pg
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec, Approval, ModelResponse, ModelToolCall, ToolSpec

T0 = 1_750_000_000.0
DAYS = 30 * 86_400
PAGE = 100
AGENTS = [f"agent-{i}" for i in range(10)]
SPEC = AgentSpec(name="agent-0", tools=[ToolSpec(name="charge", approval=Approval.ALWAYS)])


def session(i: int, rng: random.Random) -> SessionState:
    created = T0 + rng.random() * DAYS
    agent = AGENTS[i % len(AGENTS)]
    state = SessionState(id=f"s-{i:07d}", agent=agent, created_at=created)
    roll = rng.random()
    if roll < 0.03:  # in a turn; a third of them wait for an approval
        t, _ = handlers.receive_message(state, SPEC, "charge 5", None, created + 1)
        handlers.assign(state, t.ready[0].id, "w1", created + 1)
        if roll < 0.01:
            call = ModelToolCall(id="c1", name="charge", arguments={"amount": 5})
            response = ModelResponse(tool_calls=[call])
            handlers.complete_model(state, SPEC, t.ready[0].id, 1, response, created + 2)
    elif roll < 0.08:
        state.last_turn_status = TurnStatus.FAILED
    elif roll < 0.09:
        state.unknown_ended = 1
    state.updated_at = created + rng.random() * 3600
    return state


def fill_sqlite(path: Path, count: int) -> None:
    rng = random.Random(7)
    conn = sqlite3.connect(path)
    with conn:
        for i in range(count):
            w = records.write(session=session(i, rng), create=True)
            for text, params in sql.statements(w):
                conn.executemany(text, params)
    conn.close()


def fill_postgres(url: str, count: int) -> None:
    rng = random.Random(7)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        batch: dict[str, list[tuple[Any, ...]]] = {}
        for i in range(count):
            w = records.write(session=session(i, rng), create=True)
            for text, params in sql.statements(w):
                batch.setdefault(text, []).extend(params)
        for text, params in batch.items():
            cur.executemany(pg(text), params)
        cur.execute("ANALYZE sessions")


QUERIES: dict[str, SessionQuery] = {
    "all, newest created": SessionQuery(limit=PAGE),
    "agent": SessionQuery(limit=PAGE, agent="agent-3"),
    "status=idle": SessionQuery(limit=PAGE, status="idle"),
    "status=failed": SessionQuery(limit=PAGE, status="failed"),
    "status=waiting": SessionQuery(limit=PAGE, status="waiting"),
    "status=outcome_unknown": SessionQuery(limit=PAGE, outcome_unknown=True),
    "created in a week": SessionQuery(limit=PAGE, created=(T0 + 7 * 86_400, T0 + 14 * 86_400)),
    "newest updated": SessionQuery(limit=PAGE, order="updated"),
    "status=running, updated": SessionQuery(limit=PAGE, order="updated", status="running"),
}


async def deep_cursor(store: Store, query: SessionQuery) -> tuple[float, str] | None:
    """The keyset about nine tenths of the way through the query's sessions."""
    rows: list[SessionRow] = []
    before = None
    while True:
        page = await store.list_sessions(replace(query, limit=1000, before=before))
        if not page:
            break
        rows += page
        last = page[-1]
        before = (last.created_at if query.order == "created" else last.updated_at, last.id)
    if len(rows) < 2 * PAGE:
        return None
    mark = rows[len(rows) * 9 // 10 - PAGE]
    return (mark.created_at if query.order == "created" else mark.updated_at, mark.id)


async def timed(call: Callable[[], Awaitable[Any]], repeat: int = 30) -> float:
    """The milliseconds of one call: the fastest of ``repeat``, the cost of the page
    itself (on a shared machine the median moves with the neighbours' load)."""
    await call()  # warm the caches: the figure is the steady cost of a page
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return min(samples)


Result = dict[str, tuple[float, float | None]]
"""Query -> ms of its first page, and of a deep page (None: too few sessions)."""


async def measure(store: Store) -> Result:
    out: Result = {}
    for name, query in QUERIES.items():
        first = await timed(functools.partial(store.list_sessions, query))
        cursor = await deep_cursor(store, query)
        deep = None
        if cursor is not None:
            deep_query = replace(query, before=cursor)
            deep = await timed(functools.partial(store.list_sessions, deep_query))
        out[name] = (first, deep)
    out["inbox"] = (await timed(functools.partial(store.waiting_sessions, PAGE, None)), None)
    return out


async def run_sqlite(count: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="dex-bench-fleet-") as tmp:
        path = Path(tmp) / "dex.sqlite3"
        store = SqliteStore(path)
        await store.open()  # migrations
        await store.close()
        fill_sqlite(path, count)
        store = SqliteStore(path)
        await store.open()
        try:
            return await measure(store)
        finally:
            await store.close()


async def run_postgres(admin: str, count: int) -> Result:
    name = f"dex_bench_fleet_{count}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = admin.rsplit("/", 1)[0] + "/" + name
    try:
        store = PostgresStore(url)
        await store.open()
        await store.close()
        fill_postgres(url, count)
        store = PostgresStore(url)
        await store.open()
        try:
            return await measure(store)
        finally:
            await store.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def report(backend: str, sizes: list[int], results: list[Result]) -> None:
    print(f"\n{backend}: ms per page of {PAGE} sessions, fastest of 30 (first page, deep page)")
    head = "query".ljust(26) + "".join(f"{f'{n:,} sessions':>22}" for n in sizes)
    print(head)
    print("-" * len(head))
    for name in results[0]:
        cells = []
        for result in results:
            first, deep = result[name]
            cells.append(f"{first:7.2f} {'-' if deep is None else f'{deep:7.2f}':>7}")
        print(name.ljust(26) + "".join(f"{c:>22}" for c in cells))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres", help="admin URL"
    )
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"filling and measuring {', '.join(f'{n:,}' for n in args.sessions)} sessions ...")
    report("SQLite", args.sessions, [await run_sqlite(n) for n in args.sessions])
    if not args.no_postgres:
        results = [await run_postgres(args.postgres, n) for n in args.sessions]
        report("PostgreSQL", args.sessions, results)


if __name__ == "__main__":
    asyncio.run(main())

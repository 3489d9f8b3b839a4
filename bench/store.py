"""Group commit of the store: session-shaped writes per second, SQLite beside PostgreSQL.

    .venv/bin/python -m bench.store                     # 1 and 64 writers, 3 s each
    .venv/bin/python -m bench.store --seconds 5 --writers 1 8 64
    .venv/bin/python -m bench.store --postgres postgresql://postgres@127.0.0.1:5432/postgres

Each writer updates its own session: the state of a session in a turn (about 2 KB of
JSON) and two history items, committed durably (SQLite WAL with ``synchronous=FULL``;
PostgreSQL with ``synchronous_commit=on``, the fence check on every batch as an active
node does), and writes its next one when the last was acknowledged. PostgreSQL runs in a
database the benchmark creates and drops. "CPU/write" is this process's CPU time (event
loop, SQLite's writer thread, encoding) per write: it holds up on a busy machine, where
the rates do not.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.state import SessionState
from dex.server.ha.lease import Lease
from dex.server.store.base import Store
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore
from dex.wire import (
    AgentSpec,
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    ToolSpec,
    UserItem,
)

SPEC = AgentSpec(name="bench", tools=[ToolSpec(name="lookup")])


def session_in_a_turn(session_id: str) -> SessionState:
    state = SessionState(id=session_id, agent="bench", created_at=time.time())
    t, _ = handlers.receive_message(state, SPEC, "what is my balance?", None, time.time())
    step = t.ready[0]
    handlers.assign(state, step.id, "w1", time.time())
    call = ModelToolCall(id="c1", name="lookup", arguments={"account": 7})
    handlers.complete_model(state, SPEC, step.id, 1, ModelResponse(tool_calls=[call]), time.time())
    return state


async def run(store: Store, writers: int, seconds: float) -> tuple[float, float, float]:
    """(writes per second, commits per second, this process's CPU µs per write)."""
    states = [session_in_a_turn(f"w{i}-{secrets.token_hex(4)}") for i in range(writers)]
    for state in states:
        await store.write(records.write(session=state, create=True))
    done = 0
    stop = time.monotonic() + seconds
    commits_before = store.counters().commits

    async def writer(state: SessionState) -> None:
        nonlocal done
        seq = 0
        while time.monotonic() < stop:
            items: list[Item] = [
                UserItem(text=f"message {seq}"),
                AssistantItem(text="an answer " * 20),
            ]
            await store.write(records.write(session=state, history=items, history_start=seq))
            seq += 2
            done += 1

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(writer(s) for s in states))
    took, cpu = time.monotonic() - started, time.process_time() - cpu
    commits = store.counters().commits - commits_before
    return done / took, commits / took, cpu / done * 1e6


async def phase(name: str, make: Callable[[], Store], writers: list[int], seconds: float) -> None:
    for n in writers:
        store = make()
        await store.open()
        try:
            if isinstance(store, PostgresStore):
                lease = Lease(store.url, "bench")  # one node owning every partition
                taken = await lease.take_now(list(range(store.partition_count)))
                store.fence = {p: e for p, e in taken.items() if e is not None}
            ops, commits, cpu = await run(store, n, seconds)
            if isinstance(store, PostgresStore):
                await lease.release()
        finally:
            await store.close()
        print(
            f"{name:<11} {n:>3} writers  {ops:>9,.0f} writes/s  {commits:>8,.0f} commits/s"
            f"  {cpu:>5,.0f} µs CPU/write"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="an admin URL: the benchmark creates a database there and drops it",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dex.sqlite3"
        await phase("sqlite", lambda: SqliteStore(path), args.writers, args.seconds)

    name = "dex_bench_" + secrets.token_hex(4)
    try:
        admin = psycopg.connect(args.postgres, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        print(f"postgresql  skipped: cannot connect to {args.postgres}: {e}")
        return
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
        url = args.postgres.rsplit("/", 1)[0] + "/" + name
        try:
            await phase("postgresql", lambda: PostgresStore(url), args.writers, args.seconds)
        finally:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":
    asyncio.run(main())

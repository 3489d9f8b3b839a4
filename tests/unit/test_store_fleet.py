"""The session list and the inbox of the ``Store`` interface, on every backend: filters,
newest-first keyset pages, and the plans that keep a page's cost flat (an index range,
no sort), whatever the number of sessions."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dex.server.engine import handlers
from dex.server.engine.state import SessionState, TurnStatus
from dex.server.records import write
from dex.server.store import sql
from dex.server.store.base import SessionQuery, Store
from dex.server.store.postgres import PostgresStore, pg
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec, Approval, ModelResponse, ModelToolCall, ToolSpec
from tests.unit.test_store import T0, backend, create, in_a_turn, rows, store

__all__ = ["backend", "store"]

SPEC = AgentSpec(name="helper", tools=[ToolSpec(name="charge", approval=Approval.ALWAYS)])


def at(session_id: str, created: float, agent: str = "helper", **fields: Any) -> SessionState:
    return SessionState(
        id=session_id, agent=agent, created_at=created, **{"updated_at": created, **fields}
    )


def waiting(session_id: str, created: float) -> SessionState:
    """A session whose turn waits for the approval of a tool call since ``created + 2``."""
    state = at(session_id, created)
    t, _ = handlers.receive_message(state, SPEC, "charge 5", None, created + 1)
    handlers.assign(state, t.ready[0].id, "w1", created + 1)
    call = ModelToolCall(id="c1", name="charge", arguments={"amount": 5})
    handlers.complete_model(
        state, SPEC, t.ready[0].id, 1, ModelResponse(tool_calls=[call]), created + 2
    )
    assert state.person_waits()
    return state


def ids(found: list[Any]) -> list[str]:
    return [r.id for r in found]


async def test_sessions_list_newest_first_one_page_after_another(store: Store) -> None:
    for i, sid in enumerate("abcde"):
        await create(store, at(sid, T0 + i))

    pages = []
    before = None
    while True:
        page = await rows(store, limit=2, before=before)
        if not page:
            break
        pages.append(ids(page))
        before = (page[-1].created_at, page[-1].id)

    assert pages == [["e", "d"], ["c", "b"], ["a"]]
    [row] = await rows(store, limit=1)
    assert (row.agent, row.created_at, row.updated_at, row.status) == (
        "helper",
        T0 + 4,
        T0 + 4,
        "idle",
    )
    assert (row.waiting_since, row.outcome_unknown) == (None, 0)


async def test_ids_break_ties_in_byte_order_on_every_backend(store: Store) -> None:
    names = ["b", "B", "a-1", "a_1", "a", "Z", "0", "é"]
    for sid in names:
        await create(store, at(sid, T0))

    everything = await rows(store)
    after_b = await rows(store, before=(T0, "B"))

    assert ids(everything) == sorted(names, key=lambda s: s.encode(), reverse=True)
    assert ids(after_b) == ["0"]


async def test_each_filter_selects_its_sessions(store: Store) -> None:
    await create(store, at("idle", T0))
    await create(store, at("other-agent", T0 + 1, agent="other"))
    await create(store, in_a_turn("running")[0])
    await create(store, waiting("waiting", T0 + 3))
    await create(store, at("failed", T0 + 4, last_turn_status=TurnStatus.FAILED))
    await create(store, at("unknown", T0 + 5, unknown_ended=2))

    assert ids(await rows(store, agent="other")) == ["other-agent"]
    assert "other-agent" not in ids(await rows(store, agent="helper"))
    assert ids(await rows(store, status="idle")) == ["unknown", "other-agent", "idle"]
    assert ids(await rows(store, status="running")) == ["running"]
    assert ids(await rows(store, status="waiting")) == ["waiting"]
    assert ids(await rows(store, status="failed")) == ["failed"]
    assert ids(await rows(store, outcome_unknown=True)) == ["unknown"]
    [unknown] = await rows(store, outcome_unknown=True)
    assert unknown.outcome_unknown == 2
    [wait] = await rows(store, status="waiting")
    assert wait.waiting_since == T0 + 5
    assert ids(await rows(store, agent="other", status="running")) == []


async def test_time_ranges_are_half_open_and_updated_order_follows_changes(
    store: Store,
) -> None:
    for i, sid in enumerate("abcd"):
        await create(store, at(sid, T0 + i))
    # "a" changes last: it comes first by updated_at
    await store.write(write(session=at("a", T0, updated_at=T0 + 10)))

    assert ids(await rows(store, created=(T0 + 1, T0 + 3))) == ["c", "b"]
    assert ids(await rows(store, created=(T0 + 2, None))) == ["d", "c"]
    assert ids(await rows(store, updated=(None, T0 + 2))) == ["b"]
    assert ids(await rows(store, order="updated")) == ["a", "d", "c", "b"]
    assert ids(await rows(store, order="updated", before=(T0 + 10, "a"))) == ["d", "c", "b"]
    assert ids(await rows(store, order="updated", updated=(T0 + 3, None))) == ["a", "d"]


async def test_a_session_that_stops_waiting_leaves_the_inbox(store: Store) -> None:
    await create(store, at("idle", T0))
    first = waiting("first", T0)
    await create(store, first)
    await create(store, waiting("second", T0 + 10))

    assert await store.waiting_sessions(10, None) == [("second", T0 + 12), ("first", T0 + 2)]
    assert await store.waiting_sessions(1, (T0 + 12, "second")) == [("first", T0 + 2)]

    handlers.record_input(first, {"kind": "approve", "call_id": "1.1"}, T0 + 20)
    await store.write(write(session=first))  # the approval is recorded: nobody must act

    assert await store.waiting_sessions(10, None) == [("second", T0 + 12)]
    assert ids(await rows(store, status="waiting")) == ["second"]
    assert ids(await rows(store, status="running")) == ["first"]


async def test_a_tenant_filter_keeps_to_that_tenants_sessions_and_the_tenant_stays(
    store: Store,
) -> None:
    await create(store, at("none", T0))
    await create(store, at("a-1", T0 + 1, tenant="acme"))
    await create(store, waiting("a-2", T0 + 2))  # no tenant: waits, but is not acme's
    acme_waits = waiting("a-3", T0 + 3)
    acme_waits.tenant = "acme"
    await create(store, acme_waits)
    await create(store, at("b-1", T0 + 4, tenant="bolt"))
    # a later write of the session keeps its tenant
    await store.write(write(session=at("a-1", T0 + 1, updated_at=T0 + 9, tenant="acme")))

    assert ids(await rows(store, tenant="acme")) == ["a-3", "a-1"]
    assert ids(await rows(store, tenant="acme", order="updated")) == ["a-1", "a-3"]
    assert ids(await rows(store, tenant="bolt")) == ["b-1"]
    assert ids(await rows(store, tenant="nobody")) == []
    assert [r.tenant for r in await rows(store)] == ["bolt", "acme", None, "acme", None]
    assert await store.waiting_sessions(10, None, "acme") == [("a-3", T0 + 5)]
    assert await store.waiting_sessions(10, (T0 + 5, "a-3"), "acme") == []
    assert await store.waiting_sessions(10, None, "bolt") == []
    assert len(await store.waiting_sessions(10, None)) == 2


# --- plans: a page reads one index range, with no sort -----------------------------------------

QUERIES: dict[str, SessionQuery] = {
    "all": SessionQuery(limit=50),
    "agent": SessionQuery(limit=50, agent="helper"),
    "status": SessionQuery(limit=50, status="idle"),
    "outcome_unknown": SessionQuery(limit=50, outcome_unknown=True),
    "created range": SessionQuery(limit=50, created=(T0, T0 + 100)),
    "updated": SessionQuery(limit=50, order="updated"),
    "updated range": SessionQuery(limit=50, order="updated", updated=(T0, T0 + 100)),
    "status, updated": SessionQuery(limit=50, order="updated", status="running"),
    "with the last message": SessionQuery(limit=50, status="waiting", last_message=True),
    "tenant": SessionQuery(limit=50, tenant="acme"),
    "tenant, updated": SessionQuery(limit=50, order="updated", tenant="acme"),
}
"""Each filter alone with its order, on a page deep in the list (a keyset)."""


def _deep(q: SessionQuery) -> SessionQuery:
    return SessionQuery(
        limit=q.limit,
        order=q.order,
        before=(T0 + 50, "s-50"),
        agent=q.agent,
        status=q.status,
        tenant=q.tenant,
        outcome_unknown=q.outcome_unknown,
        created=q.created,
        updated=q.updated,
        last_message=q.last_message,
    )


@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_sqlite_pages_read_an_index_range_without_sorting(tmp_path: Path, name: str) -> None:
    path = tmp_path / "dex.sqlite3"
    store = SqliteStore(path)
    await store.open()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        for query in (QUERIES[name], _deep(QUERIES[name])):
            text, params = sql.list_sessions(query, "sqlite")
            plan = " / ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + text, params))
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the order
            if query.tenant is not None:  # the tenant's own index, not a scan of all
                assert "sessions_tenant" in plan, plan
            if query.before is not None:  # a deep page starts where the last one ended
                assert f"({sql.ORDER_COLUMN[query.order]},id)<(?,?)" in plan, plan
        for tenant, index in ((None, "sessions_waiting"), ("acme", "sessions_tenant_waiting")):
            text, params = sql.waiting_sessions(50, (T0, "s-1"), tenant)
            plan = " / ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + text, params))
            assert index in plan and "TEMP B-TREE" not in plan, plan
    finally:
        conn.close()


@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_postgres_pages_read_an_index_range_without_sorting(
    postgres_url: str, name: str
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    await store.close()
    with psycopg.connect(postgres_url) as conn:
        # an empty table: tell the planner that scanning it whole or sorting costs a lot, so
        # that it shows the index plan it would take for a big one, if there is one
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_sort = off")
        checks = [sql.list_sessions(q, "postgresql") for q in (QUERIES[name], _deep(QUERIES[name]))]
        checks.append(sql.waiting_sessions(50, (T0, "s-1")))
        checks.append(sql.waiting_sessions(50, (T0, "s-1"), "acme"))
        for i, (text, params) in enumerate(checks):
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + pg(text), params))
            assert "Index" in plan, plan
            assert "Seq Scan" not in plan and "Sort" not in plan, plan
            if i > 0:  # a deep page starts where the last one ended
                cond = [line for line in plan.splitlines() if "Index Cond" in line]
                assert cond and "ROW(" in cond[0], plan

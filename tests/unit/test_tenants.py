"""A session's tenant in the domain: checked at creation, and ``Reads.check_tenant``, the
check every session route of a tenant-scoped token passes through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dex.errors import InvalidInput, NotFound
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.sessions import Sessions
from dex.server.store.base import SessionQuery
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[Sessions]:
    store = SqliteStore(tmp_path / "dex.sqlite3")
    await store.open()
    try:
        domain = Sessions(store, Dispatcher(heartbeat_timeout=5))
        await domain.register_agents([AgentSpec(name="a")])
        yield domain
    finally:
        await store.close()


async def test_a_tenant_is_a_short_name_and_a_bad_one_creates_nothing(sessions: Sessions) -> None:
    assert (await sessions.create("a", "s1", "acme-1_b.c")).tenant == "acme-1_b.c"
    assert (await sessions.create("a", "s2")).tenant is None
    for bad in ("", "a b", "a" * 65, "a/b", "é"):
        with pytest.raises(InvalidInput, match="a tenant is 1-64 letters"):
            await sessions.create("a", "s3", bad)
    assert [r.id for r in await sessions.store.list_sessions(SessionQuery(limit=10))] == [
        "s2",
        "s1",
    ]


async def test_another_tenants_session_is_refused_as_one_that_does_not_exist(
    sessions: Sessions,
) -> None:
    await sessions.create("a", "mine", "acme")
    await sessions.create("a", "theirs", "bolt")
    await sessions.create("a", "nobodys")

    await sessions.reads.check_tenant("mine", "acme")
    refusals = []
    for sid in ("theirs", "nobodys", "missing"):
        with pytest.raises(NotFound) as refused:
            await sessions.reads.check_tenant(sid, "acme")
        error = refused.value
        assert error.details == {"session_id": sid}
        refusals.append(error.message.replace(sid, "<id>"))
    with pytest.raises(NotFound) as missing:
        await sessions.actors.get("missing")  # what every session route answers for it

    assert refusals == [missing.value.message.replace("missing", "<id>")] * 3


async def test_a_session_of_another_node_is_checked_from_storage_and_not_cached(
    sessions: Sessions,
) -> None:
    await sessions.create("a", "elsewhere", "acme")
    sessions.actors.drop(await sessions.actors.get("elsewhere"))
    sessions.reads.serves = lambda session_id: False  # a cluster node that serves none

    await sessions.reads.check_tenant("elsewhere", "acme")
    with pytest.raises(NotFound):
        await sessions.reads.check_tenant("elsewhere", "bolt")

    assert sessions.actors.cached("elsewhere") is None

"""A long-running server keeps bounded memory: idle sessions and old streams are forgotten
(they reload from storage), while anything in use stays."""

from __future__ import annotations

from pathlib import Path

from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.sessions import Sessions
from dex.server.store.sqlite import SqliteStore
from dex.server.streams import MemoryStreams
from dex.wire import AgentSpec


async def test_idle_sessions_beyond_the_cap_are_forgotten_and_reload(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "dex.sqlite3")
    await store.open()
    try:
        sessions = Sessions(store, Dispatcher(heartbeat_timeout=5), max_cached=3)
        await sessions.register_agents([AgentSpec(name="a")])
        for i in range(6):
            await sessions.create("a", f"s{i}")
        # a running session (its turn waits for a Worker, none is connected) stays cached
        await sessions.send("s0", "hello", None)
        for i in range(1, 6):
            await sessions.snapshot(f"s{i}")
        cached = list(sessions.actors)
        assert len(cached) == 3
        assert "s0" in cached and cached[-1] == "s5"

        evicted = await sessions.snapshot("s1")  # reloads from storage, unchanged
        assert evicted["session"]["id"] == "s1" and evicted["session"]["status"] == "idle"
        assert (await sessions.snapshot("s0"))["session"]["status"] == "running"
    finally:
        await store.close()


async def test_streams_without_subscribers_beyond_the_cap_are_forgotten() -> None:
    streams = MemoryStreams(keep=10, max_sessions=2)
    listening = streams.subscribe("s0")
    streams.publish("s0", "turn.started", {})
    first = await anext(listening)
    assert first is not None and first.type == "turn.started"
    for i in range(1, 5):
        streams.publish(f"s{i}", "turn.started", {})
    assert set(streams._streams) == {"s0", "s4"}  # the subscribed one stays
    streams.publish("s0", "turn.completed", {})
    second = await anext(listening)
    assert second is not None and second.type == "turn.completed" and second.id == 2
    await listening.aclose()

"""A long-running server keeps bounded memory: idle sessions and old streams are forgotten
(they reload from storage), while anything in use stays."""

from __future__ import annotations

from pathlib import Path

from dex.server.dispatch.dispatcher import DEADLINES_SLACK, Dispatcher, Held, WorkerConn
from dex.server.sessions import Sessions
from dex.server.store.sqlite import SqliteStore
from dex.server.streams import MemoryStreams, Rings
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
            await sessions.reads.snapshot(f"s{i}")
        cached = list(sessions.actors)
        assert len(cached) == 3
        assert "s0" in cached and cached[-1] == "s5"

        evicted = await sessions.reads.snapshot("s1")  # reloads from storage, unchanged
        assert evicted["session"]["id"] == "s1" and evicted["session"]["status"] == "idle"
        assert (await sessions.reads.snapshot("s0"))["session"]["status"] == "running"
    finally:
        await store.close()


async def test_the_cache_holds_sessions_up_to_a_size_and_a_larger_one_still_works(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "dex.sqlite3")
    await store.open()
    try:
        sessions = Sessions(store, Dispatcher(heartbeat_timeout=5), max_cached_chars=4_500)
        await sessions.register_agents([AgentSpec(name="a")])
        for i in range(4):
            await sessions.create("a", f"s{i}")
            await sessions.send(f"s{i}", "x" * 1_000, None)  # a turn waits, none is connected
            await sessions.cancel(f"s{i}", "done")  # idle again, ~1 KB of history
        await sessions.create("a", "big")
        await sessions.send("big", "y" * 5_000, None)
        await sessions.cancel("big", "done")

        for i in range(4):
            await sessions.reads.snapshot(f"s{i}")
        assert len(sessions.actors) == 3 and sessions.actors.chars <= 4_500  # ~1.3 KB each
        await sessions.reads.snapshot("big")  # over the bound alone: stays, the rest go
        assert list(sessions.actors) == ["big"]
        sent, _ = await sessions.send("big", "again", None)
        assert sent.turn == 2
        big = sessions.actors.cached("big")
        assert big is not None and sessions.actors.chars == big.chars > 5_000
    finally:
        await store.close()


async def test_streams_without_subscribers_beyond_the_cap_are_forgotten() -> None:
    streams = MemoryStreams(Rings(keep=10, max_sessions=2))
    listening = streams.subscribe("s0")
    streams.publish("s0", "turn.started", {})
    first = await anext(listening)
    assert first is not None and first.type == "turn.started"
    for i in range(1, 5):
        streams.publish(f"s{i}", "turn.started", {})
    assert set(streams.rings._rings) == {"s0", "s4"}  # the subscribed one stays
    streams.publish("s0", "turn.completed", {})
    second = await anext(listening)
    assert second is not None and second.type == "turn.completed" and second.key > first.key
    await listening.aclose()


async def test_streams_keep_at_most_max_events_in_all_forgetting_unwatched_ones_first() -> None:
    streams = MemoryStreams(Rings(keep=100, max_sessions=1_000, max_events=10))
    listening = streams.subscribe("watched")
    streams.publish("watched", "history.item", {})
    first = await anext(listening)  # subscribed now
    for _ in range(3):
        streams.publish("watched", "history.item", {})
    for i in range(20):  # 20 sessions of 3 events each, nobody listening
        for _ in range(3):
            streams.publish(f"s{i}", "history.item", {})

    kept = {sid: len(s.events) for sid, s in streams.rings._rings.items()}
    assert streams.rings.events == sum(kept.values()) <= 10
    assert kept["watched"] == 4  # a stream with a subscriber is never forgotten
    assert set(kept) == {"watched", "s18", "s19"}  # the latest of the others
    assert first is not None and first.type == "history.item"
    await listening.aclose()


def test_a_stream_at_its_keep_counts_once_per_event_it_holds() -> None:
    streams = MemoryStreams(Rings(keep=3, max_events=100))
    for _ in range(10):
        streams.publish("s", "history.item", {})
    assert streams.rings.events == 3


def test_deadlines_of_ended_attempts_leave_the_heap_and_running_ones_stay() -> None:
    dispatcher = Dispatcher(heartbeat_timeout=10)
    worker = WorkerConn(id="w", queues={"q"}, capacity=10_000, send=lambda message: None)
    for i in range(2_000):
        worker.reserved += 1
        dispatcher.hold(worker, f"a{i}", Held("s", f"1.{i}", 1, worker, deadline=1e12))
        if i >= 3:  # three stay running
            dispatcher.unhold(f"a{i}")
    assert len(dispatcher._deadlines) <= 2 * 3 + DEADLINES_SLACK + 1
    assert {"a0", "a1", "a2"} <= {attempt_id for _, _, attempt_id in dispatcher._deadlines}

"""The in-memory stream backend: ids that are never reused, resume, and bounds that drop a
subscriber which falls behind instead of waiting for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dex.server.streams import Event, MemoryStreams, Rings


async def take(events: AsyncIterator[Event | None], n: int) -> list[Event]:
    got: list[Event] = []
    while len(got) < n:
        event = await anext(events)
        if event is not None:  # a keep-alive
            got.append(event)
    return got


async def test_ids_grow_across_sessions_and_across_a_restart() -> None:
    before = MemoryStreams()
    a, b = before.subscribe("a"), before.subscribe("b")
    for i in range(3):
        before.publish("a", "history.item", {"index": i})
        before.publish("b", "history.item", {"index": i})
    ids = [int(e.id) for e in await take(a, 3) + await take(b, 3)]
    await a.aclose()
    await b.aclose()

    after = MemoryStreams()  # the node restarted: its first id is past every earlier one
    after.publish("a", "turn.started", {})
    [first] = await take(after.subscribe("a"), 1)
    assert len(set(ids)) == 6 and int(first.id) > max(ids)


async def test_a_subscriber_resumes_after_the_last_id_it_saw() -> None:
    streams = MemoryStreams()
    for i in range(5):
        streams.publish("s", "history.item", {"index": i})
    seen = await take(streams.subscribe("s"), 5)
    resumed = await take(streams.subscribe("s", seen[1].id), 3)
    assert [e.data["index"] for e in resumed] == [2, 3, 4]


async def test_resuming_with_an_id_from_before_a_restart_is_told_of_the_gap() -> None:
    before = MemoryStreams()
    before.publish("s", "model.delta", {"text": "lost"})  # nobody listens: not even kept
    before.publish("s", "history.item", {"index": 0})
    [old] = await take(before.subscribe("s"), 1)

    after = MemoryStreams()
    after.publish("s", "history.item", {"index": 1})
    gap, item = await take(after.subscribe("s", old.id), 2)
    assert gap.type == "stream.gap" and gap.id == ""  # not an id to resume from
    assert item.data == {"index": 1}


async def test_a_subscriber_that_falls_behind_is_dropped_and_the_others_keep_up() -> None:
    streams = MemoryStreams(Rings(keep=5))
    slow, fast = streams.subscribe("s"), streams.subscribe("s")
    streams.publish("s", "history.item", {"index": 0})
    await take(slow, 1)  # subscribed, then stops reading
    fast_seen = await take(fast, 1)
    for i in range(1, 20):
        streams.publish("s", "model.delta", {"text": str(i)})
        fast_seen += await take(fast, 1)  # a fast one never misses an event

    [notice] = await take(slow, 1)
    assert notice.type == "stream.dropped" and "5 events behind" in notice.data["reason"]
    assert await anext(slow, "ended") == "ended"
    assert streams.dropped == 1 and streams.subscribers == 1
    assert [e.data.get("text", "0") for e in fast_seen] == [str(i) for i in range(20)]
    assert len(streams.rings._rings["s"].events) == 5  # its buffer stayed bounded
    await fast.aclose()
    assert streams.subscribers == 0


async def test_events_older_than_the_age_bound_are_forgotten() -> None:
    now = [100.0]
    streams = MemoryStreams(Rings(max_age=60), clock=lambda: now[0])
    streams.publish("s", "history.item", {"index": 0})
    streams.publish("s", "history.item", {"index": 1})
    first, _ = await take(streams.subscribe("s"), 2)
    now[0] += 61
    streams.publish("s", "history.item", {"index": 2})

    assert [e.data["index"] for e in streams.rings._rings["s"].events] == [2]
    gap, item = await take(streams.subscribe("s", first.id), 2)
    assert gap.type == "stream.gap" and item.data == {"index": 2}


async def test_an_id_this_node_never_gave_is_a_gap_then_everything_buffered() -> None:
    streams = MemoryStreams()
    streams.publish("s", "turn.started", {})
    for unknown in ("99999999999999999", "1796195166824-3"):  # ahead of it; Redis's form
        gap, started = await take(streams.subscribe("s", unknown), 2)
        assert gap.type == "stream.gap" and started.type == "turn.started"


async def test_ending_the_subscriptions_ends_each_one_after_what_it_was_sent() -> None:
    streams = MemoryStreams()
    streams.publish("s", "history.item", {"index": 0})
    live = streams.subscribe("s")
    assert [e.data["index"] for e in await take(live, 1)] == [0]
    waiting = asyncio.ensure_future(anext(live))  # nothing new: it waits for an event
    await asyncio.sleep(0)
    assert not waiting.done()

    streams.end_subscriptions()  # the node stops serving
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 5)
    later = [e async for e in streams.subscribe("s")]  # one that starts after: ends at once
    assert later == [] and streams.subscribers == 0

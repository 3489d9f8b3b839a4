"""Live streams in Redis: what one node published, the next one serves, with no gap and
no duplicate of a history item; bounded by length and age; and Redis going away never
stops a publisher. Against a real Redis (``redis_url``)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from dex.server.streams import Event
from dex.server.streams.redis import RedisStreams


async def take(events: AsyncIterator[Event | None], n: int) -> list[Event]:
    got: list[Event] = []
    while len(got) < n:
        event = await anext(events)
        if event is not None:
            got.append(event)
    return got


@pytest.fixture
def prefix() -> str:
    return f"dex-test-{secrets.token_hex(4)}"


async def node(url: str, prefix: str, **options: Any) -> RedisStreams:
    streams = RedisStreams(url, prefix=prefix, **options)
    await streams.start()
    return streams


def items(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "user", "text": t} for t in texts]


async def test_a_restarted_node_serves_what_the_old_one_published_after_the_last_id(
    redis_url: str, prefix: str
) -> None:
    old = await node(redis_url, prefix)
    history = items("hello")
    listening = old.subscribe("s")
    old.publish_history("s", history, 0)
    old.publish("s", "model.delta", {"text": "hi "})
    old.publish("s", "model.delta", {"text": "there"})
    seen = await take(listening, 3)
    await listening.aclose()
    await old.close()

    new = await node(redis_url, prefix)  # the same stream, another node's lifetime
    history.append({"type": "assistant", "text": "hi there"})
    new.publish_history("s", history, 1)
    resumed = await take(new.subscribe("s", seen[0].id), 3)
    assert [e.id for e in resumed[:2]] == [e.id for e in seen[1:]]  # Redis's ids, kept
    assert resumed[2].type == "history.item" and resumed[2].data["index"] == 1
    assert [e.key for e in seen + resumed[2:]] == sorted(e.key for e in seen + resumed[2:])
    await new.close()


async def test_each_history_item_is_in_the_stream_once_even_when_a_node_died_before_its_publish(
    redis_url: str, prefix: str
) -> None:
    old = await node(redis_url, prefix)
    history = items("0", "1")
    old.publish_history("s", history, 0)
    await take(old.subscribe("s"), 2)
    await old.close()

    # committed, never published: items 2 and 3 (the node died between); then a new node
    # publishes the next commit's item 4 and, as a replay would, items 0-1 again
    new = await node(redis_url, prefix)
    history += items("2", "3", "4")
    new.publish_history("s", history, 4)
    new.publish_history("s", history, 0)
    listening = new.subscribe("s")
    got = await take(listening, 5)
    assert [e.data["index"] for e in got] == [0, 1, 2, 3, 4]
    await listening.aclose()

    # the last items committed and never published, with no commit after: a subscriber's
    # catch_up fills them in before it reads
    history += items("5", "6")
    await new.catch_up("s", history)
    await new.catch_up("s", history)  # twice: nothing more
    got = await take(new.subscribe("s", got[-1].id), 2)
    assert [e.data["index"] for e in got] == [5, 6]
    stream = aioredis.Redis.from_url(redis_url)
    assert await stream.xlen(f"{prefix}:{{s}}:events") == 7
    await stream.aclose()
    await new.close()


async def test_a_stream_is_bounded_by_length_and_a_resume_past_its_start_is_a_gap(
    redis_url: str, prefix: str
) -> None:
    streams = await node(redis_url, prefix, maxlen=10)
    listening = streams.subscribe("s")
    for i in range(500):
        streams.publish("s", "model.delta", {"text": str(i)})
    seen = await take(listening, 500)
    await listening.aclose()
    stream = aioredis.Redis.from_url(redis_url)
    length = await stream.xlen(f"{prefix}:{{s}}:events")
    await stream.aclose()
    assert length < 250  # MAXLEN ~ trims whole blocks of entries: about, not exactly, 10

    gap, *rest = await take(streams.subscribe("s", seen[0].id), 1 + length)
    assert gap.type == "stream.gap"
    assert [e.id for e in rest] == [e.id for e in seen[-length:]]
    await streams.close()


async def test_a_quiet_stream_expires_after_the_age_bound(redis_url: str, prefix: str) -> None:
    streams = await node(redis_url, prefix, max_age=0.2)
    streams.publish_history("s", items("hello"), 0)
    [seen] = await take(streams.subscribe("s"), 1)
    client = aioredis.Redis.from_url(redis_url)
    key = f"{prefix}:{{s}}:events"
    assert 0 < await client.pttl(key) <= 200
    deadline = asyncio.get_running_loop().time() + 5
    while await client.exists(key):  # Redis expires it on its own clock
        assert asyncio.get_running_loop().time() < deadline, "the stream did not expire"
        await asyncio.sleep(0.02)
    await client.aclose()

    streams.publish("s", "turn.started", {})
    gap, started = await take(streams.subscribe("s", seen.id), 2)
    assert gap.type == "stream.gap" and started.type == "turn.started"
    await streams.close()


async def test_a_subscriber_that_falls_behind_is_dropped(redis_url: str, prefix: str) -> None:
    streams = await node(redis_url, prefix, keep=5)
    slow, fast = streams.subscribe("s"), streams.subscribe("s")
    streams.publish("s", "model.delta", {"text": "0"})
    await take(slow, 1)
    seen = await take(fast, 1)
    for i in range(1, 30):
        streams.publish("s", "model.delta", {"text": str(i)})
        seen += await take(fast, 1)
    [notice] = await take(slow, 1)
    assert notice.type == "stream.dropped"
    assert [e.data["text"] for e in seen] == [str(i) for i in range(30)]
    await fast.aclose()
    await streams.close()


async def test_with_redis_away_publishing_neither_fails_nor_grows_without_bound(
    prefix: str,
) -> None:
    streams = await node("redis://127.0.0.1:1/0", prefix, max_pending=10)  # nothing listens
    for i in range(30):
        streams.publish("s", "model.delta", {"text": str(i)})
    assert streams.lost == 20 and len(streams._pending) <= 10
    listening = streams.subscribe("s")
    [notice] = await take(listening, 1)
    assert notice.type == "stream.gap" and "Redis is away" in notice.data["reason"]
    await listening.aclose()
    await streams.close()


async def test_publishing_goes_on_when_redis_forgets_the_script(
    redis_url: str, prefix: str
) -> None:
    streams = await node(redis_url, prefix)
    listening = streams.subscribe("s")
    streams.publish("s", "turn.started", {})
    await take(listening, 1)
    client = aioredis.Redis.from_url(redis_url)
    await client.script_flush()  # as a Redis restart without persistence does
    await client.aclose()
    streams.publish("s", "turn.completed", {})
    [completed] = await take(listening, 1)
    assert completed.type == "turn.completed" and streams.publish_failures == 0
    await listening.aclose()
    await streams.close()


async def test_an_id_redis_never_gave_is_a_gap_then_the_latest_events(
    redis_url: str, prefix: str
) -> None:
    streams = await node(redis_url, prefix)
    streams.publish("s", "turn.started", {})
    await take(streams.subscribe("s"), 1)
    # a browser tab's last id from the in-memory backend (microseconds: far in the future
    # as a Redis id), kept across a restart onto Redis
    gap, started = await take(streams.subscribe("s", "1796195166824471"), 2)
    assert gap.type == "stream.gap" and started.type == "turn.started"
    await streams.close()

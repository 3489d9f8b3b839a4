"""Live streams in Redis Streams (``dex server --streams redis://…``): they survive the node.

Each session's events go to one Redis stream, ``dex:{SESSION}:events``, with Redis's own
ids (``1733150000000-3``), so a subscriber resumes with ``Last-Event-ID`` on the node that
restarted or took over, and reads what the old node published. The history items of the
session are in the stream exactly once, in order, with no gap: a small key beside the
stream, ``dex:{SESSION}:history``, holds the index of the last one in it, and the script
that appends an item checks it in the same step. A node that died between a commit and
its publish leaves a hole; the next publish of that session, or the next subscriber
(``catch_up``), finds it and fills it from the committed history.

Publishing never waits for Redis: events queue (bounded), one task sends them in
pipelined batches, and then hands each, with its id, to the node's own subscribers
(``Rings``), so Redis is read only when a subscriber starts or resumes. If Redis is
away, the task tries again; past the queue's bound the oldest events are dropped and
counted, and the history holes are filled when Redis is back.

Streams are bounded by length (``MAXLEN ~``), by age (``MINID ~`` on Redis's clock) and
expire when a session is quiet for longer than the age bound.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from dex.server.streams.memory import Event, Key, Ringed, Rings, gap, parse_id

log = logging.getLogger("dex.streams")

PUBLISH = """
-- KEYS: the stream, the index of the last history item in it
-- ARGV: type, data, history index ('' for other events), maxlen, max age ms, 'check'
local index = ARGV[3]
if index ~= '' then
  index = tonumber(index)
  local last = redis.call('GET', KEYS[2])
  if ARGV[6] == 'check' then  -- catch_up: where the stream's history ends, nothing added
    if not last then
      redis.call('SET', KEYS[2], index, 'PX', ARGV[5])
      return {index}
    end
    return {tonumber(last)}
  end
  if last then
    last = tonumber(last)
    if index ~= last + 1 then return {last} end  -- in the stream already, or a hole before
  end
  redis.call('SET', KEYS[2], index, 'PX', ARGV[5])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
local id = redis.call(
  'XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'type', ARGV[1], 'data', ARGV[2])
local now = redis.call('TIME')
local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[5])
if oldest > 0 then redis.call('XTRIM', KEYS[1], 'MINID', '~', oldest) end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return id
"""

BATCH = 256
"""Events sent in one pipeline."""
PAGE = 500
"""Events read in one XRANGE when a subscriber resumes."""


@dataclass(slots=True)
class _Pending:
    session_id: str
    type: str
    data: dict[str, Any] | None
    """None for a history item: built from ``history`` when it is sent."""
    index: int | None = None
    history: Sequence[dict[str, Any]] = ()

    def payload(self) -> dict[str, Any]:
        if self.data is not None:
            return self.data
        assert self.index is not None
        return {"index": self.index, "item": self.history[self.index]}


def _events(rows: Any) -> list[Event]:
    """XRANGE's answer as events."""
    return [
        Event(i.decode(), f[b"type"].decode(), orjson.loads(f[b"data"]), _key(i))
        for i, f in rows or ()
    ]


def _key(value: bytes) -> Key:
    key = parse_id(value.decode())
    assert key is not None
    return key


class RedisStreams(Ringed):
    def __init__(
        self,
        url: str,
        *,
        maxlen: int = 10_000,
        max_age: float = 3600.0,
        replay: int = 1000,
        max_pending: int = 100_000,
        keep: int = 1000,
        prefix: str = "dex",
    ) -> None:
        self.url = url
        self.maxlen = maxlen
        """Events kept per session's stream (about: Redis trims whole blocks)."""
        self.max_age = max_age
        """Seconds an event is kept; a stream with nothing newer expires."""
        self.replay = replay
        """Events a new subscriber without ``Last-Event-ID`` gets first: the latest ones."""
        self.max_pending = max_pending
        """Events waiting for Redis, beyond which the oldest are dropped."""
        self.prefix = prefix
        self.rings = Rings(keep, max_age=max_age, keep_unwatched=False)
        self.lost = 0
        """Events dropped before Redis had them (it was away and the queue was full)."""
        self.publish_failures = 0
        """Batches Redis refused or did not answer, tried again."""
        self._redis = aioredis.Redis.from_url(url)
        self._sha = hashlib.sha1(PUBLISH.encode()).hexdigest()
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _keys(self, session_id: str) -> list[str]:
        # one hash slot per session ({...}), so the script's two keys live together
        return [f"{self.prefix}:{{{session_id}}}:events", f"{self.prefix}:{{{session_id}}}:history"]

    async def start(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as e:
            log.warning(
                "Redis at %s does not answer (%s): live events queue until it does",
                self.url,
                e,
                extra={"action": "streams.redis_away"},
            )
        self._task = asyncio.create_task(self._send_forever(), name="dex-streams-redis")

    async def close(self) -> None:
        if self._task is not None:
            if self._pending:  # what the node published last: give Redis a moment for it
                self._wake.set()
                await asyncio.wait([self._task], timeout=1.0)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._redis.aclose()

    # --- publishing ---------------------------------------------------------------------

    def publish(self, session_id: str, type_: str, data: dict[str, Any]) -> None:
        self._queue(_Pending(session_id, type_, data))

    def publish_history(
        self, session_id: str, history: Sequence[dict[str, Any]], start: int
    ) -> None:
        for i in range(start, len(history)):
            self._queue(_Pending(session_id, "history.item", None, i, history))

    def _queue(self, pending: _Pending) -> None:
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self.lost += 1
        self._pending.append(pending)
        self._wake.set()

    async def _send_forever(self) -> None:
        delay = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
                try:
                    holes = await self._send(batch)
                except (RedisError, OSError) as e:
                    self.publish_failures += 1
                    room = self.max_pending - len(self._pending)
                    self.lost += max(0, len(batch) - room)
                    self._pending.extendleft(reversed(batch[len(batch) - max(0, room) :]))
                    log.warning(
                        "Redis refused %d live events (%s): trying again in %.2fs",
                        len(batch),
                        e,
                        delay,
                        extra={"action": "streams.publish_failed"},
                    )
                    await asyncio.sleep(delay)  # backoff before the retry
                    delay = min(delay * 2, 2.0)
                    continue
                delay = 0.05
                self._pending.extendleft(reversed(holes))

    async def _send(self, batch: list[_Pending]) -> list[_Pending]:
        """Append ``batch`` to the streams, in order, and hand each appended event to this
        node's subscribers. Returns the history items that fill holes found on the way:
        they go first in the next batch."""
        calls = [
            (
                self._keys(p.session_id),
                [
                    p.type,
                    orjson.dumps(p.payload()),
                    "" if p.index is None else str(p.index),
                    self.maxlen,
                    self._age_ms,
                    "",
                ],
            )
            for p in batch
        ]
        results = await self._publish(calls)
        holes: list[_Pending] = []
        for p, result in zip(batch, results, strict=True):
            if isinstance(result, list):  # a history item that is in already, or a hole
                last = int(result[0])
                assert p.index is not None
                holes.extend(
                    _Pending(p.session_id, "history.item", None, i, p.history)
                    for i in range(last + 1, p.index + 1)
                )
                continue
            key = _key(result)
            event = Event(result.decode(), p.type, p.payload(), key, time.monotonic())
            self.rings.append(p.session_id, event, (0, 0))
        return holes

    async def _publish(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """The publishing script once per call, in one pipeline: by its hash (EVALSHA, no
        SCRIPT EXISTS before each batch as redis-py's scripts do), loaded again if Redis
        lost it (a restart)."""
        for loaded in (False, True):
            async with self._redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(self._sha, len(keys), *keys, *args)
                try:
                    return await pipe.execute()
                except NoScriptError:
                    if loaded:
                        raise
            self._sha = await self._redis.script_load(PUBLISH)
        raise AssertionError("unreachable")

    @property
    def _age_ms(self) -> int:
        return int(self.max_age * 1000)

    async def catch_up(self, session_id: str, history: Sequence[dict[str, Any]]) -> None:
        """Make sure the stream has every committed history item: a node that died after a
        commit and before its publish left the last ones out. A stream that expired starts
        again from the end of the history: nobody can resume into its past anyway."""
        if not history:
            return
        keys = self._keys(session_id)
        [result] = await self._publish(
            [(keys, ["", b"", len(history) - 1, 0, self._age_ms, "check"])]
        )
        last = int(result[0])
        missing = [
            _Pending(session_id, "history.item", None, i, history)
            for i in range(last + 1, len(history))
        ]
        while missing:
            missing = await self._send(missing)

    # --- subscribing --------------------------------------------------------------------

    async def subscribe(
        self, session_id: str, after: str | None = None
    ) -> AsyncGenerator[Event | None, None]:
        """Events after id ``after`` (the latest ``replay`` ones if None), read from Redis,
        then live ones from this node. ``stream.gap`` first when Redis no longer has all
        that followed ``after``."""
        ring = self.rings.watch(session_id, (0, 0))  # from now on, appends are kept here
        stream = self._keys(session_id)[0]
        key = parse_id(after)
        last: Key | None = None
        try:
            if after is not None and key is None:
                yield gap(f"{after!r} is not an id of this stream")
            try:
                if key is not None:
                    async with self._redis.pipeline(transaction=False) as pipe:
                        pipe.xrange(stream, count=1)
                        pipe.xrevrange(stream, count=1)
                        first, newest = (_events(rows) for rows in await pipe.execute())
                    if not first or first[0].key > key:
                        yield gap("Redis no longer has the events after this id")
                    elif key > newest[0].key:  # another backend's id, or another Redis's
                        yield gap(f"{after!r} is not an id of this stream")
                        key = None
                if key is None:
                    rows = _events(await self._redis.xrevrange(stream, count=self.replay))
                    for row in reversed(rows):
                        last = row.key
                        yield row
                else:
                    last = at = key
                    while rows := _events(
                        await self._redis.xrange(stream, min=f"({at[0]}-{at[1]}", count=PAGE)
                    ):
                        for row in rows:
                            last = at = row.key
                            yield row
            except (RedisError, OSError) as e:
                last = None  # only what this node publishes from now on
                yield gap(f"Redis is away ({e}): only new events follow")
            async for event in self.rings.follow(ring, last):
                yield event
        finally:
            self.rings.unwatch(session_id, ring)

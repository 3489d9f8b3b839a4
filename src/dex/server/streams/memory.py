"""The default stream backend: each session's recent events, in this node's memory.

Events are numbered per session from 1; a subscriber that gives the last id it saw
(``Last-Event-ID``) gets what followed, as long as it is still in the buffer. The
buffer is this node's: after a restart numbering starts again and the lost partial
output is gone, while the durable history (read with the snapshot) is complete.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    id: int
    type: str
    data: dict[str, Any]


@dataclass(eq=False)
class _Stream:
    events: deque[Event]
    next_id: int = 1
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: int = 0


class MemoryStreams:
    def __init__(
        self, keep: int = 1000, max_sessions: int = 10_000, max_events: int = 50_000
    ) -> None:
        self.keep = keep
        """Events kept per session for subscribers that resume."""
        self.max_sessions = max_sessions
        """Sessions whose recent events are kept; the least recently active ones without a
        subscriber are forgotten beyond that."""
        self.max_events = max_events
        """Events kept in all sessions together, forgotten the same way beyond that: memory
        follows this, not sessions times ``keep``."""
        self.events = 0
        """Events buffered now, in all sessions."""
        self._streams: OrderedDict[str, _Stream] = OrderedDict()

    def _stream(self, session_id: str) -> _Stream:
        stream = self._streams.get(session_id)
        if stream is None:
            stream = self._streams[session_id] = _Stream(deque(maxlen=self.keep))
            self._evict(session_id)
        else:
            self._streams.move_to_end(session_id)
        return stream

    def _evict(self, current: str | None = None) -> None:
        """Forget the least recently active streams without a subscriber (never
        ``current``'s) until both bounds hold."""
        sessions = len(self._streams) - self.max_sessions
        events = self.events - self.max_events
        if sessions <= 0 and events <= 0:
            return
        unwatched: list[str] = []
        watched: list[str] = []
        for session_id, stream in self._streams.items():  # oldest first; stops at enough
            if sessions <= 0 and events <= 0:
                break
            if stream.subscribers or session_id == current:
                watched.append(session_id)
                continue
            unwatched.append(session_id)
            sessions -= 1
            events -= len(stream.events)
        for session_id in unwatched:
            self.events -= len(self._streams.pop(session_id).events)
        for session_id in watched:  # passed over once, not at every new stream
            self._streams.move_to_end(session_id)

    def publish(self, session_id: str, type_: str, data: dict[str, Any]) -> None:
        if session_id not in self._streams and type_ == "model.delta":
            return  # nobody listens, and deltas are not worth keeping for later
        stream = self._stream(session_id)
        if len(stream.events) < self.keep:
            self.events += 1  # else the append drops the stream's oldest event
        stream.events.append(Event(stream.next_id, type_, data))
        stream.next_id += 1
        if self.events > self.max_events:
            self._evict(session_id)
        stream.changed.set()
        stream.changed = asyncio.Event()

    async def subscribe(
        self, session_id: str, after: int | None = None
    ) -> AsyncGenerator[Event | None, None]:
        """Events after id ``after`` (all buffered ones if None), then live ones. Yields
        None when nothing happened for a while, so the caller can send a keep-alive."""
        stream = self._stream(session_id)
        stream.subscribers += 1
        last = after if after is not None and after < stream.next_id else 0
        try:
            while True:
                waiter = stream.changed  # before looking: a publish from now on wakes it
                fresh = [e for e in stream.events if e.id > last]
                for event in fresh:
                    last = event.id
                    yield event
                if fresh:
                    continue  # more may have come while the caller handled these
                try:
                    await asyncio.wait_for(waiter.wait(), 15.0)
                except TimeoutError:
                    yield None
        finally:
            stream.subscribers -= 1

"""The default stream backend: each session's recent events, in this node's memory.

Ids are decimal numbers from one counter for the whole node, started at the boot time in
microseconds: they grow across sessions and across restarts, so an id is never reused.
A subscriber that gives the last id it saw (``Last-Event-ID``) gets what followed while
it is still in the buffer. The buffer is this node's: after a restart the lost partial
output is gone (a resuming subscriber is told with ``stream.gap``), while the durable
history, read with the snapshot, is complete.

``Rings`` is the part both backends share: per session, a bounded buffer of recent events
that any number of subscribers read at their own pace. A subscriber that falls behind
the buffer gets ``stream.dropped`` and its subscription ends; nobody waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dex import _lru

Key = tuple[int, int]
"""An id's place in the order: ``(number, 0)`` here, ``(milliseconds, sequence)`` in Redis."""

KEEP_ALIVE = 15.0
"""Seconds without an event after which a subscription yields None (for a keep-alive)."""


class Event(NamedTuple):
    """One event of a session's stream: a named tuple, the cheapest record to build, as
    each turn publishes several."""

    id: str
    """What the subscriber sends back as ``Last-Event-ID``; "" for the stream's own notices
    (``stream.gap``, ``stream.dropped``), which are not resumable."""
    type: str
    data: dict[str, Any]
    key: Key = (0, 0)
    at: float = 0.0
    """When it was buffered (monotonic seconds): what the age bound reads."""


def gap(reason: str) -> Event:
    """Events between the subscriber's id and the first one it gets next are gone: the
    snapshot has the durable history, the partial text of a running attempt is lost."""
    return Event("", "stream.gap", {"reason": reason})


def dropped(reason: str) -> Event:
    return Event("", "stream.dropped", {"reason": reason})


def parse_id(value: str | None) -> Key | None:
    """``"123"`` or ``"123-4"`` as a key; None for None or anything else."""
    if value is None:
        return None
    number, _, seq = value.partition("-")
    if not number.isdigit() or (seq and not seq.isdigit()):
        return None
    return int(number), int(seq or 0)


@dataclass(eq=False)
class _Ring:
    events: deque[Event]
    complete_after: Key
    """Every event of this session after this key is in ``events`` or was evicted (and
    ``evicted`` says up to where)."""
    evicted: Key = (0, 0)
    """The latest key dropped by the length or age bound."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: int = 0
    ended: bool = False
    """The node handed the session over: its subscribers end (and resume on the node
    that serves it now); a later use of the session here starts a new ring."""


class Rings:
    """Per session, a bounded buffer of recent events and the subscribers that read it."""

    def __init__(
        self,
        keep: int = 1000,
        max_sessions: int = 10_000,
        max_events: int = 50_000,
        max_age: float = 3600.0,
        *,
        keep_unwatched: bool = True,
    ) -> None:
        self.keep = keep
        """Events kept per session for subscribers that resume or fall behind."""
        self.max_sessions = max_sessions
        """Sessions whose recent events are kept; the least recently active ones without a
        subscriber are forgotten beyond that."""
        self.max_events = max_events
        """Events kept in all sessions together, forgotten the same way beyond that: memory
        follows this, not sessions times ``keep``."""
        self.max_age = max_age
        """Seconds an event is kept."""
        self.keep_unwatched = keep_unwatched
        """Keep events of sessions nobody watches (False: another store keeps them, as
        Redis does, and a ring lives only while someone subscribes)."""
        self.events = 0
        """Events buffered now, in all sessions."""
        self.subscribers = 0
        self.dropped = 0
        """Subscribers dropped because they fell behind the buffer."""
        self.ended = False
        """The node stopped serving: every subscription ends."""
        self._rings: OrderedDict[str, _Ring] = OrderedDict()

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._rings

    def ring(self, session_id: str, complete_after: Key) -> _Ring:
        ring = self._rings.get(session_id)
        if ring is not None and ring.ended:
            self.events -= len(ring.events)
            ring = None
        if ring is None:
            ring = self._rings[session_id] = _Ring(deque(), complete_after)
            self._evict(session_id)
        else:
            self._rings.move_to_end(session_id)
        return ring

    def append(self, session_id: str, event: Event, complete_after: Key) -> None:
        """Buffer ``event`` and wake the session's subscribers. ``complete_after``: the key
        before the first event, for a ring this creates."""
        ring = self._rings.get(session_id)
        if ring is None:
            if not self.keep_unwatched:
                return
            ring = self.ring(session_id, complete_after)
        else:
            self._rings.move_to_end(session_id)
        events = ring.events
        oldest = event.at - self.max_age
        while events and (len(events) >= self.keep or events[0].at < oldest):
            ring.evicted = events.popleft().key
            self.events -= 1
        events.append(event)
        self.events += 1
        if self.events > self.max_events:
            self._evict(session_id)
        if ring.subscribers:  # else nobody waits on it (``follow`` runs while watched)
            ring.changed.set()
            ring.changed = asyncio.Event()

    def _evict(self, current: str | None = None) -> None:
        """Forget the least recently active rings without a subscriber (never
        ``current``'s) until both bounds hold."""
        self.events -= _lru.evict(
            self._rings,
            len(self._rings) - self.max_sessions,
            self.events - self.max_events,
            lambda ring: len(ring.events),
            lambda session_id, ring: bool(ring.subscribers) or session_id == current,
        )

    async def follow(self, ring: _Ring, after: Key | None) -> AsyncGenerator[Event | None, None]:
        """The ring's events after ``after`` (every buffered one when None), then live
        ones; None after a quiet while (for a keep-alive). Between ``watch`` and
        ``unwatch``."""
        last = max(ring.complete_after, ring.evicted)
        if after is not None and after < last:
            yield gap("events after this id are no longer buffered on this node")
        elif after is not None:
            last = after
        while not self.ended and not ring.ended:
            if last < ring.evicted:
                self.dropped += 1
                yield dropped(f"this subscriber fell more than {self.keep} events behind")
                return
            waiter = ring.changed  # before looking: an append from now on wakes it
            fresh: list[Event] = []
            for event in reversed(ring.events):  # the new ones are at the end
                if event.key <= last:
                    break
                fresh.append(event)
            fresh.reverse()
            for event in fresh:
                last = event.key
                yield event
            if fresh:
                continue  # more may have come while the caller handled these
            try:
                await asyncio.wait_for(waiter.wait(), KEEP_ALIVE)
            except TimeoutError:
                yield None

    def end(self) -> None:
        """End every subscription (each ``follow`` returns), now and from now on."""
        self.ended = True
        for ring in self._rings.values():
            ring.changed.set()

    def end_sessions(self, which: Callable[[str], bool]) -> None:
        """End the subscriptions of the sessions ``which`` takes (a cluster node handed
        them over): their clients resume through the node that serves them now."""
        for session_id, ring in self._rings.items():
            if which(session_id):
                ring.ended = True
                ring.changed.set()

    def watch(self, session_id: str, complete_after: Key) -> _Ring:
        """Count a subscriber in: the ring keeps what is appended from now on."""
        ring = self.ring(session_id, complete_after)
        ring.subscribers += 1
        self.subscribers += 1
        return ring

    def unwatch(self, session_id: str, ring: _Ring) -> None:
        ring.subscribers -= 1
        self.subscribers -= 1
        if self._rings.get(session_id) is not ring:
            return  # ended and replaced: its events were counted out then
        if not ring.subscribers and not self.keep_unwatched:
            self.events -= len(ring.events)
            self._rings.pop(session_id, None)


class Ringed:
    """A stream backend whose subscribers read from ``rings``: their counts are its own."""

    rings: Rings

    @property
    def subscribers(self) -> int:
        return self.rings.subscribers

    @property
    def dropped(self) -> int:
        return self.rings.dropped

    def end_subscriptions(self) -> None:
        self.rings.end()

    def end_sessions(self, which: Callable[[str], bool]) -> None:
        self.rings.end_sessions(which)


class MemoryStreams(Ringed):
    def __init__(
        self, rings: Rings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``rings``: their bounds (default: ``Rings()``'s)."""
        self.rings = rings or Rings()
        self._clock = clock
        self._last = time.time_ns() // 1000
        """The latest id given, or the boot time in microseconds before the first."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def publish(self, session_id: str, type_: str, data: dict[str, Any]) -> None:
        if type_ == "model.delta" and session_id not in self.rings:
            return  # nobody listens, and deltas are not worth keeping for later
        self._last += 1
        event = Event(str(self._last), type_, data, (self._last, 0), self._clock())
        self.rings.append(session_id, event, (self._last - 1, 0))

    def publish_history(
        self, session_id: str, history: Sequence[dict[str, Any]], start: int
    ) -> None:
        for i in range(start, len(history)):
            self.publish(session_id, "history.item", {"index": i, "item": history[i]})

    async def catch_up(self, session_id: str, history: Sequence[dict[str, Any]]) -> None:
        """Nothing to do: this node published every item it committed."""

    async def subscribe(
        self, session_id: str, after: str | None = None
    ) -> AsyncGenerator[Event | None, None]:
        """Events after id ``after`` (all buffered ones if None), then live ones. Yields
        None when nothing happened for a while, so the caller can send a keep-alive."""
        ring = self.rings.watch(session_id, (self._last, 0))
        key = parse_id(after)
        if after is not None and (key is None or key > (self._last, 0)):
            key = (0, 0)  # not an id this node gave: everything buffered, after a gap
        try:
            async for event in self.rings.follow(ring, key):
                yield event
        finally:
            self.rings.unwatch(session_id, ring)

"""The actor cache: the sessions in memory, each one an ``Actor`` that applies one input at
a time.

An actor holds what the node knows of one session: its state as committed (and, while a
commit is in flight, as that commit will leave it), each history item's JSON, what
storage holds of the current turn's rows, the latest ended turns, and who waits for a
turn to end. Inputs take turns on an actor: ``run_when_free`` runs a function at once if
the actor is free, or when the one before it lets go (``release``), in order; a commit
holds the actor from its handler until its effects have run. An actor that a failed
commit left ahead of storage is dropped (``drop``) and loads again on next use; a
function that then finds itself on a dropped actor refuses (``Actors.owns``).

Idle sessions past ``max_cached``, or past ``max_cached_chars`` of their stored JSON, are
forgotten, least recently used first: a session in a turn, or one somebody works on or
waits on, stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dex import _lru
from dex.errors import CorruptRecord, NotFound
from dex.server import records
from dex.server.engine.state import SessionState, SessionStatus, Turn
from dex.server.store.base import Store

log = logging.getLogger("dex.sessions")

RECENT_TURNS = 4
"""Ended turns each actor keeps, as committed: a waiter gets its turn without a read."""


def unknown_session(session_id: str) -> NotFound:
    """What a session storage does not have answers (and one a request may not see)."""
    return NotFound(f"unknown session {session_id!r}", session_id=session_id)


@dataclass(eq=False)
class Actor:
    state: SessionState
    history_json: list[dict[str, Any]] = field(default_factory=list)
    """Each history item's JSON form, made once: a RunModel hand-out carries the history."""
    rows: records.Rows = field(default_factory=records.Rows)
    """What storage holds of the current turn's Steps and calls: a commit writes the rest."""
    ended: dict[int, Turn] = field(default_factory=dict)
    """The latest ended turns, as committed."""
    turn_waiters: dict[int, list[asyncio.Future[Turn | None]]] = field(default_factory=dict)
    """Per turn number, who waits for it to end."""
    busy: bool = False
    """An input holds the actor: its handler ran, its commit is not done yet."""
    chars: int = 0
    """Its size as stored JSON (state, rows, history): what the cache's size bound counts."""
    _next: deque[Callable[[], None]] = field(default_factory=deque)

    def run_when_free(self, run: Callable[[], None]) -> None:
        """Call ``run`` holding the actor: now if it is free, else after the inputs before
        it. ``run`` (or what it starts) must ``release`` it."""
        if self.busy:
            self._next.append(run)
        else:
            self.busy = True
            run()

    def release(self) -> None:
        """Let go: the next waiting input runs now, holding the actor."""
        if self._next:
            self._next.popleft()()
        else:
            self.busy = False

    async def acquire(self) -> None:
        """Wait until this caller holds the actor."""
        if not self.busy:
            self.busy = True
            return
        held = asyncio.get_running_loop().create_future()
        self._next.append(lambda: held.set_result(None) if not held.done() else self.release())
        try:
            await held
        except asyncio.CancelledError:
            if held.done() and not held.cancelled():
                self.release()  # it was handed over as the caller gave up: pass it on
            raise

    def remember(self, turn: Turn) -> None:
        """An ended turn, as committed: wake who waits for it."""
        self.ended[turn.number] = turn
        while len(self.ended) > RECENT_TURNS:
            del self.ended[min(self.ended)]
        for waiter in self.turn_waiters.pop(turn.number, ()):
            if not waiter.done():
                waiter.set_result(turn)

    def wake_if_waiting(self) -> None:
        """The current turn waits for a person: who waits for it hears of it now."""
        turn = self.state.turn
        if turn is None or turn.number not in self.turn_waiters or not self.state.person_waits():
            return
        for waiter in self.turn_waiters.pop(turn.number):
            if not waiter.done():
                waiter.set_result(turn)

    def wake_all(self) -> None:
        """Who waits for any turn hears now, with no turn: the node stops serving."""
        waiters, self.turn_waiters = self.turn_waiters, {}
        for waiter in (w for ws in waiters.values() for w in ws):
            if not waiter.done():
                waiter.set_result(None)

    @property
    def idle(self) -> bool:
        """Nothing holds it, waits on it or is recorded for it: it may be forgotten."""
        return (
            self.state.status == SessionStatus.IDLE
            and not self.busy
            and not self.turn_waiters
            and not self.state.inbox
        )


class Actors:
    def __init__(
        self, store: Store, max_cached: int = 10_000, max_cached_chars: int = 64 << 20
    ) -> None:
        self.store = store
        self.max_cached = max_cached
        """How many idle sessions stay in memory; older idle ones reload from storage."""
        self.max_cached_chars = max_cached_chars
        """And how much of them, as stored JSON (in memory they take a few times that): a
        cache of long conversations holds fewer of them."""
        self.chars = 0
        """The stored size of the sessions in memory."""
        self._actors: OrderedDict[str, Actor] = OrderedDict()
        self._loading: dict[str, asyncio.Future[Actor]] = {}

    def cached(self, session_id: str) -> Actor | None:
        actor = self._actors.get(session_id)
        if actor is not None:
            self._actors.move_to_end(session_id)
        return actor

    def owns(self, actor: Actor) -> bool:
        """Whether ``actor`` is the session's actor still (a failed commit drops it)."""
        return self._actors.get(actor.state.id) is actor

    def drop(self, actor: Actor) -> None:
        """Forget an actor whose memory ran ahead of storage: the session loads again."""
        if self.owns(actor):
            del self._actors[actor.state.id]
            self.chars -= actor.chars

    def grew(self, actor: Actor, chars: int) -> None:
        """A commit added ``chars`` of stored JSON (history) to a session in memory."""
        if self.owns(actor):
            actor.chars += chars
            self.chars += chars

    def __len__(self) -> int:
        return len(self._actors)

    def actors(self) -> list[Actor]:
        """The actors in memory, in no useful order, without touching their recency."""
        return list(self._actors.values())

    def __iter__(self) -> Iterator[str]:
        """The ids of the sessions in memory, least recently used first."""
        return iter(list(self._actors))

    async def get(self, session_id: str) -> Actor:
        """The session's actor, loaded from storage if it is not in memory; ``NotFound`` for
        a session storage does not have."""
        actor = self.cached(session_id)
        if actor is not None:
            return actor
        pending = self._loading.get(session_id)
        if pending is not None:
            return await pending
        fut: asyncio.Future[Actor] = asyncio.get_running_loop().create_future()
        self._loading[session_id] = fut
        try:
            raw = await self.store.load_session(session_id)
            if raw is None:
                raise unknown_session(session_id)
            try:
                state, history, rows = records.session(raw, session_id)
            except CorruptRecord as e:
                log.error(
                    "%s", e.message, extra={"action": "session.corrupt", "session_id": session_id}
                )
                raise CorruptRecord(
                    f"{e.message}. The session is left as stored; every other session serves",
                    session_id=session_id,
                ) from e
            actor = Actor(
                state=state,
                history_json=[item.model_dump(mode="json") for item in history],
                rows=rows,
                chars=sum(map(len, [raw.state, *raw.steps, *raw.calls, *raw.history])),
            )
            self._actors[session_id] = actor
            self.chars += actor.chars
            self._evict(session_id)
            fut.set_result(actor)
            return actor
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: other waiters re-raise it
            raise
        finally:
            del self._loading[session_id]

    def _evict(self, loaded: str) -> None:
        """Forget idle sessions, least recently used first, beyond either bound; never the
        one just ``loaded`` (a session larger than the bound alone still works)."""
        self.chars -= _lru.evict(
            self._actors,
            len(self._actors) - self.max_cached,
            self.chars - self.max_cached_chars,
            lambda actor: actor.chars,
            lambda session_id, actor: not actor.idle or session_id == loaded,
        )

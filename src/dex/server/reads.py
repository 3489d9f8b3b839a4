"""What clients read: a session's snapshot and timeline, its live events, pages of
sessions and of what waits for people, the connected Workers, and the long poll that
waits for a turn to end. Nothing here changes a session: the views are built by
``views`` from the state the actors hold, as storage has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from dex.errors import CorruptRecord, NotFound
from dex.server import fleet, records, views
from dex.server.actors import Actor, Actors, unknown_session
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.engine.state import Turn
from dex.server.flow import TenantBudgets
from dex.server.store.base import SessionRow, Store
from dex.server.streams import Event, Streams
from dex.wire import AgentSpec


class Reads:
    def __init__(
        self,
        store: Store,
        actors: Actors,
        streams: Streams,
        dispatcher: Dispatcher,
        agents: Mapping[str, AgentSpec],
    ) -> None:
        self.store = store
        self.actors = actors
        self.streams = streams
        self.dispatcher = dispatcher
        self.agents = agents
        """The registered agents (``Sessions.agents``, read as it changes)."""
        self.tenants: TenantBudgets | None = None
        """The tenants' budgets: a snapshot shows its session's tenant's usage."""
        self.waits_ended = False
        """The node stopped serving: a request that waits for a turn answers at once."""
        self.turn_waits = 0
        """Requests waiting for a turn to end now (long polls held)."""
        self.serves: Callable[[str], bool] | None = None
        """In a cluster, whether this node serves a session: one it does not is read
        straight from storage and never cached here (its owner changes it). None: all."""

    def end_waits(self) -> None:
        """The node stops serving: every request that waits for a turn answers now, with
        the turn as it stands, and so does each one after, so that its client asks the
        node that serves next instead of holding a long poll to this one; every live event
        stream ends, so that its subscriber resumes there."""
        self.waits_ended = True
        for actor in self.actors.actors():
            actor.wake_all()
        self.streams.end_subscriptions()

    # --- pages across sessions ---------------------------------------------------------

    async def list_sessions(
        self, filters: fleet.Filters, limit: int, cursor: str | None, *, last_message: bool = False
    ) -> tuple[list[SessionRow], str | None]:
        """One page of the sessions ``filters`` select, and the next page's cursor (with
        ``last_message``, rows with the session's last message: ``ListedSession``)."""
        return await fleet.list_sessions(
            self.store, filters, limit, cursor, last_message=last_message
        )

    async def inbox(
        self, limit: int, cursor: str | None, tenant: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """What waits for a person (approvals, questions) across sessions (``tenant``: of
        that tenant), one page."""
        return await fleet.inbox(self.store, self.person_waits, limit, cursor, tenant)

    def workers_view(self) -> list[dict[str, Any]]:
        """The connected Workers: what they serve and what they run."""
        return views.workers(self.dispatcher, self.agents)

    # --- one session -----------------------------------------------------------------------

    async def wait_turn(
        self, session_id: str, number: int, timeout: float
    ) -> tuple[Turn | None, list[dict[str, Any]]]:
        """The turn once it has ended or waits for a person, with what it waits for (an
        approval, an answer); ``(None, [])`` if it runs on past ``timeout``."""
        actor = await self.actors.get(session_id)
        if number < 1 or number > actor.state.messages_received:
            raise NotFound(f"session {session_id} has no turn {number}")
        found = await self._turn_now(actor, number)
        if found[0] is not None or timeout <= 0 or self.waits_ended:
            return found
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[Turn | None] = loop.create_future()
        waiters = actor.turn_waiters.setdefault(number, [])
        waiters.append(woken)
        timer = loop.call_later(timeout, _give_up, woken)
        self.turn_waits += 1
        try:
            # it may have moved on while storage was read: look once more, now that
            # ``woken`` is registered to hear of it
            found = await self._turn_now(actor, number)
            if found[0] is not None or self.waits_ended:
                return found
            await woken  # the turn ended, waits for a person, or the time is up
            return await self._turn_now(actor, number)
        finally:
            self.turn_waits -= 1
            timer.cancel()
            if woken in waiters:
                waiters.remove(woken)
            if not waiters and actor.turn_waiters.get(number) is waiters:
                del actor.turn_waiters[number]

    async def _turn_now(
        self, actor: Actor, number: int
    ) -> tuple[Turn | None, list[dict[str, Any]]]:
        """Turn ``number`` if it has ended, or if it is the current one and waits for a
        person (with what it waits for); ``(None, [])`` while it runs on."""
        turn = actor.ended.get(number) or await self._ended_turn(actor, number)
        if turn is not None:
            return turn, []
        current = actor.state.turn
        if current is not None and current.number == number:
            waits = views.person_waits(actor.state)
            if waits:
                return current, waits
        return None, []

    async def _ended_turn(self, actor: Actor, number: int) -> Turn | None:
        turn = actor.state.turn
        if turn is not None and turn.number == number:
            return None
        if any(m.number == number for m in actor.state.queued):
            return None
        return actor.ended.get(number) or records.maybe_turn(
            await self.store.load_turn(actor.state.id, number), actor.state.id
        )

    async def check_tenant(self, session_id: str, tenant: str) -> None:
        """Nothing if the session is ``tenant``'s; else the very ``NotFound`` of a session
        storage does not have, so that another tenant's session looks like no session (a
        stored record that cannot be read too: whose it is cannot be told). A session of
        another node is read from storage, never cached here (its tenant never changes)."""
        try:
            if self.serves is not None and not self.serves(session_id):
                raw = await self.store.load_session(session_id)
                if raw is None:
                    raise unknown_session(session_id)
                state = records.session(raw, session_id)[0]
            else:
                state = (await self.actors.get(session_id)).state
        except CorruptRecord:
            raise unknown_session(session_id) from None
        if state.tenant != tenant:
            raise unknown_session(session_id)

    async def events(self, session_id: str, after: str | None) -> AsyncIterator[Event | None]:
        """The session's live events after id ``after`` (``Streams.subscribe``), once the
        stream has every committed history item. ``NotFound`` before anything streams."""
        actor = await self.actors.get(session_id)
        await self.streams.catch_up(session_id, actor.history_json)
        return self.streams.subscribe(session_id, after)

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        return (await self.timeline(session_id))[0]

    async def timeline(self, session_id: str) -> tuple[dict[str, Any], list[Turn]]:
        """The snapshot, and every turn in order (the ended ones, then the current one):
        the console's session page shows each turn's Steps, which the snapshot holds for
        the current turn only. One read of storage for both."""
        async with self._as_stored(session_id) as actor:
            state = actor.state
            ended = [records.turn(t, session_id) for t in await self.store.load_turns(session_id)]
            snapshot = views.snapshot(state, actor.history_json, ended, self.dispatcher)
            turns = [*ended, *filter(None, [state.turn])]
        if state.tenant is not None and self.tenants is not None:
            [snapshot["session"]["tenant_usage"]] = await self.tenants.view(state.tenant)
        return snapshot, turns

    async def approvals(self, session_id: str) -> list[dict[str, Any]]:
        async with self._as_stored(session_id) as actor:
            return views.pending_approvals(actor.state)

    async def person_waits(self, session_id: str) -> list[dict[str, Any]]:
        """What the session's turn waits for a person to do, as the inbox lists it."""
        if self.serves is not None and not self.serves(session_id):
            raw = await self.store.load_session(session_id)  # another node's: as stored
            if raw is None:
                return []
            state, _, _ = records.session(raw, session_id)
            return views.person_waits(state)
        async with self._as_stored(session_id) as actor:
            return views.person_waits(actor.state)

    @contextlib.asynccontextmanager
    async def _as_stored(self, session_id: str) -> AsyncIterator[Actor]:
        """The session's actor, held while the block reads it, once no commit of it is in
        flight: its state is what storage holds. (A handler changes the state in memory
        before its commit; a read between the two would show what may never be committed,
        such as a hand-out whose commit then fails.)"""
        while True:
            actor = await self.actors.get(session_id)
            await actor.acquire()
            if self.actors.owns(actor):
                break
            actor.release()  # its commit failed and it was dropped: load the session again
        try:
            yield actor
        finally:
            actor.release()


def _give_up(waiter: asyncio.Future[Turn | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)

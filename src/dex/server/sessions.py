"""The domain layer: what clients, Workers and the node's own timers ask of sessions.

Each session is an actor (``actors``) that applies one input at a time: an input (a user
message, a Step result, a failed attempt, a hand-out) runs a pure handler
(``engine.handlers``) on the session's state, and the committer (``committer``) writes the
transition in one durable commit; only then does anything outside learn of it: the
caller gets its answer, Workers get their Steps, waiters wake. What a client reads is
built by ``views``; what a Worker is handed, by ``handouts``.

A hot-path input is recorded and handled in that one commit. A wait's resolution (an
approval, a denial, an answer, a fired timer) takes two: the first records it in the
session's inbox (the caller's acknowledgement), the second runs the handler that moves
the turn on. A node that dies between them runs the handler on start.

The Worker channel settles attempts with ``complete_soon``, ``fail_soon`` and
``hand_back_soon``: they return a future at once, so one frame's results join one group
commit without a task each.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from pydantic import BaseModel

from dex import _failpoints as failpoints
from dex.errors import Conflict, CorruptRecord, DexError, InvalidInput, NotFound
from dex.server import fleet, records, views
from dex.server.actors import Actor, Actors
from dex.server.committer import Committer, Handle
from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn
from dex.server.engine import fork, handlers
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    AttemptError,
    SessionState,
    Step,
    ToolCall,
    Turn,
    attempt_id,
    parse_attempt_id,
)
from dex.server.metrics import Metrics
from dex.server.store.base import SessionRow, Store, Write
from dex.server.streams import Event, MemoryStreams, Streams
from dex.wire import (
    ITEMS,
    MAX_JSON_DEPTH,
    AgentSpec,
    AttemptProgress,
    ModelResponse,
    RecoveryError,
    StepStatus,
    StepType,
    Summary,
    ToolOutcome,
    too_deep,
    worker_frames,
)

if TYPE_CHECKING:
    from dex.server.tracing import Tracing  # OpenTelemetry: imported only when tracing is on

log = logging.getLogger("dex.sessions")

M = TypeVar("M", bound=BaseModel)
Failure = RecoveryError | worker_frames.RecoveryError | AttemptError
"""Why an attempt failed: from the API or a Worker's frame, or the server's own."""

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
CALL_ID = re.compile(r"([1-9][0-9]{0,17})\.[1-9][0-9]{0,17}")
"""A tool call's id: its turn's number, a dot, its place in the turn."""
T = TypeVar("T")


class Sessions:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        streams: Streams | None = None,
        *,
        max_cached: int = 10_000,
        max_cached_chars: int = 64 << 20,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.clock = dispatcher.clock
        self.streams = streams or MemoryStreams()
        self.metrics = metrics or Metrics()
        self.tracing = tracing
        """Spans of turns, Steps and attempts (``dex.server.tracing``); None: tracing off."""
        self.actors = Actors(store, max_cached, max_cached_chars)
        self.committer = Committer(
            store, dispatcher, self.actors, self.streams, self.metrics, tracing
        )
        self.agents: dict[str, AgentSpec] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.corrupt: set[str] = set()
        """Sessions whose stored records could not be read at start: they were not
        recovered (each answers ``corrupt_record``), every other one was."""
        self.waits_ended = False
        """The node stopped serving: a request that waits for a turn answers at once."""
        self.turn_waits = 0
        """Requests waiting for a turn to end now (long polls held)."""
        self.background_failures = 0
        """Background writes (a timer firing, a handler, an expired attempt) that failed
        and were tried again."""

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "background work failed",
                exc_info=task.exception(),
                extra={"action": "sessions.task_failed"},
            )

    async def _retrying(
        self, what: str, op: Callable[[], Coroutine[Any, Any, None]], **ids: Any
    ) -> None:
        """Run background work until it commits: a storage error never drops a timer, a
        recorded input or an attempt's failure. ``Conflict`` and ``NotFound`` mean the
        state moved on without it: nothing to do."""
        delay = 0.05
        while True:
            try:
                await op()
                return
            except (Conflict, NotFound):
                return
            except Exception as e:
                self.background_failures += 1
                log.warning(
                    "%s failed, trying again in %.2fs: %r",
                    what,
                    delay,
                    e,
                    exc_info=not isinstance(e, DexError),
                    extra={"action": "sessions.retry", "what": what, **ids},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def end_waits(self) -> None:
        """The node stops serving: every request that waits for a turn answers now, with
        the turn as it stands, and so does each one after, so that its client asks the
        node that serves next instead of holding a long poll to this one; every live event
        stream ends, so that its subscriber resumes there."""
        self.waits_ended = True
        for actor in self.actors.actors():
            actor.wake_all()
        self.streams.end_subscriptions()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- applying inputs ------------------------------------------------------------------

    def _soon(
        self, session_id: str, build: Callable[[Actor], Handle], **options: Any
    ) -> asyncio.Future[Transition]:
        """Apply an input as soon as the session's actor is free: ``build`` (called holding
        it) returns the handler; the future resolves once its commit is durable and its
        effects ran. Costs no task when the session is in memory."""
        actor = self.actors.cached(session_id)
        if actor is None:
            return asyncio.ensure_future(self._loaded(session_id, build, options))
        return self._when_free(actor, build, options)

    async def _loaded(
        self, session_id: str, build: Callable[[Actor], Handle], options: dict[str, Any]
    ) -> Transition:
        actor = await self.actors.get(session_id)
        return await self._when_free(actor, build, options)

    def _when_free(
        self, actor: Actor, build: Callable[[Actor], Handle], options: dict[str, Any]
    ) -> asyncio.Future[Transition]:
        done: asyncio.Future[Transition] = asyncio.get_running_loop().create_future()

        def run() -> None:
            try:
                handle = build(actor)
            except BaseException as e:
                actor.release()
                done.set_exception(e)
                return
            self.committer.commit(actor, handle, done=done, **options)

        actor.run_when_free(run)
        return done

    async def _apply(self, actor: Actor, handle: Handle, **options: Any) -> Transition:
        return await self._when_free(actor, lambda _: handle, options)

    async def _apply_held(self, actor: Actor, handle: Handle, **options: Any) -> Transition:
        """Commit ``handle`` on an actor the caller acquired (and that this lets go)."""
        return await self.committer.commit(actor, handle, **options)

    # --- start -----------------------------------------------------------------------

    async def start(self, reason: str = "the server restarted", parallel: int = 1024) -> int:
        """Load agents, fail every attempt left running, apply recorded inputs, arm timers,
        and queue what was queued. Only the sessions in a turn are read: an idle one loads
        when it is first used. They recover ``parallel`` at a time, in two waves: every
        session of the wave is loaded (the reads reach the store together), then every one
        recovers (little work lies between two of their writes, so they share a few
        commits). Returns how many attempts were failed."""
        if self.tracing is not None:
            self.tracing.started_at = self.clock.now()  # what ended before is the old node's
        self.agents = {a.name: a for a in self._readable_agents(await self.store.load_agents())}

        async def recover(actor: Actor) -> int:
            session_id = actor.state.id
            queued = {step.id for step in actor.state.queued_steps()}
            running = await self._recover(actor, reason)
            for step in actor.state.queued_steps():
                if step.id in queued:  # retries that recover() queued are offered already
                    self.dispatcher.offer(session_id, step.id, step.queue, step.not_before)
            for step in actor.state.waiting_steps():
                if step.type == StepType.AWAIT_TIMER and step.wait and step.wait.deadline:
                    self.dispatcher.arm_timer(session_id, step.id, step.wait.deadline)
            await self._process_inbox(session_id)
            return running

        sessions = await self.store.running_sessions()
        failed = 0
        for first in range(0, len(sessions), parallel):
            wave = sessions[first : first + parallel]
            actors = await asyncio.gather(*(self._loadable(s) for s in wave))
            failed += sum(await asyncio.gather(*(recover(a) for a in actors if a is not None)))
        return failed

    def _readable_agents(self, raws: list[str]) -> list[AgentSpec]:
        """The stored agents that can be read; a damaged one is logged and left out (its
        Worker registers it again on connecting)."""
        agents = []
        for raw in raws:
            try:
                agents.append(records.agent(raw))
            except CorruptRecord as e:
                log.error("%s", e.message, extra={"action": "agent.corrupt"})
        return agents

    async def _loadable(self, session_id: str) -> Actor | None:
        """The session's actor, or None if its stored records cannot be read (logged: the
        node starts without it, and it answers ``corrupt_record``)."""
        try:
            return await self.actors.get(session_id)
        except CorruptRecord:
            self.corrupt.add(session_id)
            return None

    async def _recover(self, actor: Actor, reason: str) -> int:
        """Fail every attempt of the session that storage calls running (NOT_COMPLETED);
        returns how many."""
        types = [step.type.value for step in actor.state.running_steps()]
        if types:
            spec = self._spec(actor.state.agent)
            await self._apply(actor, functools.partial(_recover, spec=spec, reason=reason))
            for step_type in types:
                self.metrics.attempt_ended(step_type, "failed", "NOT_COMPLETED")
        return len(types)

    async def fail_held(self, reason: str) -> int:
        """Fail every attempt a Worker still holds, as a node stopping does (group commit
        makes it one transaction, or few). Returns how many failed."""
        by_session: dict[str, list[str]] = {}
        for aid, held in self.dispatcher.held.items():
            by_session.setdefault(held.session_id, []).append(aid)

        async def fail_session(session_id: str, held: list[str]) -> int:
            actor = await self.actors.get(session_id)
            running = await self._recover(actor, reason)
            for aid in held:
                self.dispatcher.unhold(aid)
            return running

        counts = await asyncio.gather(*(fail_session(s, a) for s, a in by_session.items()))
        return sum(counts)

    # --- agents ------------------------------------------------------------------------

    async def register_agents(self, specs: list[AgentSpec]) -> None:
        changed = [s for s in specs if self.agents.get(s.name) != s]
        if changed:
            await self.store.write(records.write(agents=changed))
            for spec in changed:
                self.agents[spec.name] = spec

    def _spec(self, agent: str) -> AgentSpec:
        spec = self.agents.get(agent)
        if spec is None:
            raise NotFound(
                f"unknown agent {agent!r}: no Worker has registered it; start a Worker that "
                f"defines it (dex worker MODULE), then try again",
                agent=agent,
            )
        return spec

    # --- client inputs ------------------------------------------------------------------

    async def create(self, agent: str, session_id: str | None) -> SessionState:
        self._spec(agent)
        now = self.clock.now()
        state = SessionState(id=_new_id(session_id), agent=agent, created_at=now, updated_at=now)
        await self._write_new(records.new_session(state))
        return state

    async def fork(self, session_id: str, before: int, new_id: str | None) -> SessionState:
        """A new session whose history is this one's before turn ``before``
        (``engine.fork``); the original is only read."""
        actor = await self.actors.get(session_id)
        await actor.acquire()  # a consistent view: no input moves it while it is read
        try:
            ended = [records.turn(raw) for raw in await self.store.load_turns(session_id)]
            history = ITEMS.validate_python(actor.history_json)
            state, history, turns = fork.fork(
                actor.state, history, ended, before, _new_id(new_id), self.clock.now()
            )
        finally:
            actor.release()
        await self._write_new(
            records.write(session=state, create=True, history=history, archived_turns=turns)
        )
        return state

    async def _write_new(self, write: Write) -> None:
        try:
            await self.store.write(write)
        except Conflict:  # a new session's row conflicts only on its id
            assert write.session is not None
            sid = write.session.id
            raise Conflict(f"session {sid!r} already exists", session_id=sid) from None

    async def list_sessions(
        self, filters: fleet.Filters, limit: int, cursor: str | None, *, last_message: bool = False
    ) -> tuple[list[SessionRow], str | None]:
        """One page of the sessions ``filters`` select, and the next page's cursor (with
        ``last_message``, rows with the session's last message: ``ListedSession``)."""
        return await fleet.list_sessions(
            self.store, filters, limit, cursor, last_message=last_message
        )

    async def inbox(
        self, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """What waits for a person (approvals, questions) across sessions, one page."""

        return await fleet.inbox(self.store, self.person_waits, limit, cursor)

    async def send(self, session_id: str, text: str, message_id: str | None) -> tuple[int, bool]:
        """Returns (message number, whether this call created it)."""
        if message_id is None:
            t = await self._soon(session_id, functools.partial(self._message, text, None))
            assert t.message is not None
            return t.message, True
        actor = await self.actors.get(session_id)
        await actor.acquire()  # no other input between the look-up and the commit
        try:
            known = await self.store.find_message(session_id, message_id)
            handle = None if known is not None else self._message(text, message_id, actor)
        except BaseException:
            actor.release()
            raise
        if known is not None:
            actor.release()
            return known, False
        assert handle is not None
        t = await self._apply_held(actor, handle, message_id=message_id)
        assert t.message is not None
        return t.message, True

    def _message(self, text: str, message_id: str | None, actor: Actor) -> Handle:
        spec = self._spec(actor.state.agent)

        return lambda s, now: handlers.receive_message(s, spec, text, message_id, now)[0]

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
            return snapshot, [*ended, *filter(None, [state.turn])]

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

    # --- waits: approvals, answers, timers, cancel, reconcile ------------------------------

    async def resolve(self, session_id: str, entry: dict[str, Any]) -> None:
        """Record a wait's resolution durably (the caller's acknowledgement), then run the
        handler that moves the turn on in a second commit. A crash between the two runs
        the handler on start; the resolution stays recorded."""
        actor = await self.actors.get(session_id)

        def record(s: SessionState, now: float) -> Transition:
            handlers.record_input(s, entry, now)
            return Transition()

        try:
            await self._apply(actor, record)
        except NotFound:
            ended = await self._ended_call(actor, entry["call_id"])
            if ended is None:
                raise
            turn, call = ended
            raise Conflict(
                f"tool call {call.id} is not waiting any more: its turn {turn.number} has "
                f"ended ({turn.status.value}), and the call is {call.status.value}",
                call_id=call.id,
                turn=turn.number,
                call_status=call.status.value,
            ) from None
        self._spawn(
            self._retrying(
                "applying a recorded input",
                lambda: self._process_inbox(session_id),
                session_id=session_id,
            )
        )

    async def _ended_call(self, actor: Actor, call_id: str) -> tuple[Turn, ToolCall] | None:
        """The ended turn that holds tool call ``call_id``, with the call; None if no turn
        of the session has it. The cached copy of the turn, if any, is the one waiters read."""
        match = CALL_ID.fullmatch(call_id)
        if match is None:
            return None
        number = int(match[1])
        if number > actor.state.messages_received:
            return None  # no such turn, and a number storage could not even look up
        turn = actor.ended.get(number) or records.maybe_turn(
            await self.store.load_turn(actor.state.id, number), actor.state.id
        )
        call = turn.tool_call(call_id) if turn is not None else None
        return (turn, call) if turn is not None and call is not None else None

    async def fire_timer(self, session_id: str, step_id: str) -> None:
        async def fire() -> None:
            actor = await self.actors.get(session_id)
            step = actor.state.turn.step(step_id) if actor.state.turn else None
            if step is None or step.status != StepStatus.WAITING or step.tool_call_id is None:
                return  # fired already, or the turn ended
            await self.resolve(session_id, {"kind": "timer", "call_id": step.tool_call_id})

        await self._retrying("firing a timer", fire, session_id=session_id, step_id=step_id)

    async def _process_inbox(self, session_id: str) -> None:
        actor = await self.actors.get(session_id)
        spec = self._spec(actor.state.agent)

        def handle(s: SessionState, now: float) -> Transition:
            failpoints.hit("server.handler_running")
            return handlers.apply_input(s, spec, now)

        while actor.state.inbox:
            await self._apply(actor, handle)

    async def cancel(self, session_id: str, reason: str) -> int:
        """Cancel the running turn; returns its number."""
        actor = await self.actors.get(session_id)
        spec = self._spec(actor.state.agent)
        number: list[int] = []

        def handle(s: SessionState, now: float) -> Transition:
            if s.turn is None:
                raise Conflict(f"session {session_id} has no running turn")
            number.append(s.turn.number)
            return handlers.cancel_turn(s, spec, now, reason)

        await self._apply(actor, handle)
        return number[0]

    async def reconcile(
        self,
        session_id: str,
        call_id: str,
        status: str,
        result: Any,
        error: str | None,
        by: str | None,
    ) -> ToolCall:
        """Record what really happened to an outcome_unknown call; the model sees a note."""
        actor = await self.actors.get(session_id)
        await actor.acquire()  # no other input between reading the call and the commit
        try:
            turn = actor.state.turn
            archived = turn is None or turn.tool_call(call_id) is None
            if archived:
                ended = await self._ended_call(actor, call_id)
                if ended is None:
                    raise NotFound(f"session {session_id} has no tool call {call_id!r}")
                turn = ended[0]
            assert turn is not None
            call = turn.tool_call(call_id)
            assert call is not None
        except BaseException:
            actor.release()
            raise

        def handle(s: SessionState, now: float) -> Transition:
            return handlers.reconcile_call(s, call, archived, status, result, error, by, now)

        # a failed commit drops the actor (and the loaded turn): nothing half-applied stays
        await self._apply_held(
            actor, handle, archived_call=(turn.number, call) if archived else None
        )
        return call

    def workers_view(self) -> list[dict[str, Any]]:
        """The connected Workers: what they serve and what they run."""
        return views.workers(self.dispatcher, self.agents)

    async def approvals(self, session_id: str) -> list[dict[str, Any]]:
        async with self._as_stored(session_id) as actor:
            return views.pending_approvals(actor.state)

    async def person_waits(self, session_id: str) -> list[dict[str, Any]]:
        """What the session's turn waits for a person to do, as the inbox lists it."""
        async with self._as_stored(session_id) as actor:
            return views.person_waits(actor.state)

    # --- Worker inputs -------------------------------------------------------------------

    async def assign(
        self, session_id: str, step_id: str, worker: WorkerConn
    ) -> dict[str, Any] | None:
        """Record a hand-out of a queued Step to ``worker``; None if it is not queued any more."""
        actor = await self.actors.get(session_id)

        def handle(s: SessionState, now: float) -> Transition:
            step = s.turn.step(step_id) if s.turn else None
            if step is None or step.status != StepStatus.QUEUED:
                raise _NotQueued
            handlers.assign(s, step_id, worker.id, now)
            return Transition()

        try:
            await self._apply(actor, handle, dispatch=False)
        except _NotQueued:
            return None
        step = actor.state.turn.step(step_id) if actor.state.turn else None
        assert step is not None
        return self.committer.handout(actor, step, worker)

    def complete_soon(
        self, attempt: str, payload: dict[str, Any] | bytes
    ) -> asyncio.Future[Transition]:
        """Commit an attempt's result (a JSON object, parsed or as its text: a Worker's
        frame keeps it JSON, validated once by the type its Step expects). Raises at once
        for a result that cannot apply."""
        failpoints.hit("server.before_commit_result")
        if _too_deep(payload):
            raise InvalidInput(f"the result nests deeper than {MAX_JSON_DEPTH} levels")
        session_id, step_id, number = _parse(attempt)
        ended = _Ended("succeeded", None)

        def build(actor: Actor) -> Handle:
            spec = self._spec(actor.state.agent)
            step = ended.step = actor.state.turn.step(step_id) if actor.state.turn else None

            def handle(s: SessionState, now: float) -> Transition:
                if step is not None and step.type == StepType.RUN_MODEL:
                    response = _validated(ModelResponse, payload)
                    return handlers.complete_model(s, spec, step_id, number, response, now)
                if step is not None and step.type == StepType.COMPACT_CONTEXT:
                    summary = _validated(Summary, payload)
                    return handlers.complete_summary(s, spec, step_id, number, summary, now)
                outcome = _validated(ToolOutcome, payload)
                return handlers.complete_tool(s, spec, step_id, number, outcome, now)

            return handle

        done = self._soon(session_id, build, release=attempt)
        done.add_done_callback(functools.partial(self._settled, ended))
        return done

    async def complete(self, attempt: str, payload: dict[str, Any] | bytes) -> None:
        await self.complete_soon(attempt, payload)

    def fail_soon(
        self, attempt: str, error: Failure, *, backoff: bool = True
    ) -> asyncio.Future[Transition]:
        session_id, step_id, number = _parse(attempt)
        failure = (
            error
            if isinstance(error, AttemptError)
            else AttemptError(
                message=error.message,
                attempt_progress=error.attempt_progress,
                retryable=error.retryable,
            )
        )

        ended = _Ended("failed", failure.attempt_progress.value)

        def build(actor: Actor) -> Handle:
            spec = self._spec(actor.state.agent)
            ended.step = actor.state.turn.step(step_id) if actor.state.turn else None
            return lambda s, now: handlers.fail_attempt(
                s, spec, step_id, number, failure, now, backoff=backoff
            )

        done = self._soon(session_id, build, release=attempt)
        done.add_done_callback(functools.partial(self._settled, ended))
        return done

    async def fail(self, attempt: str, error: Failure, *, backoff: bool = True) -> None:
        await self.fail_soon(attempt, error, backoff=backoff)

    def hand_back_soon(self, attempt: str) -> asyncio.Future[Transition]:
        session_id, step_id, number = _parse(attempt)
        ended = _Ended("handed_back", None)

        def build(actor: Actor) -> Handle:
            ended.step = actor.state.turn.step(step_id) if actor.state.turn else None
            return lambda s, now: handlers.hand_back(s, step_id, number)

        done = self._soon(session_id, build, release=attempt)
        done.add_done_callback(functools.partial(self._settled, ended))
        return done

    async def hand_back(self, attempt: str) -> None:
        await self.hand_back_soon(attempt)

    def _settled(self, ended: _Ended, done: asyncio.Future[Transition]) -> None:
        """After an attempt's end committed: count it."""
        if done.cancelled() or done.exception() is not None:
            return
        step_type = ended.step.type.value if ended.step is not None else "unknown"
        if ended.progress is None:
            self.metrics.attempt_ended(step_type, ended.outcome)
        else:
            self.metrics.attempt_ended(step_type, ended.outcome, ended.progress)
        if ended.outcome == "succeeded":
            failpoints.hit("server.after_commit_result")

    async def expire(self, held: Held) -> None:
        """An attempt's Worker is gone (its connection closed and it did not come back
        within the reconnect grace) or silent (no heartbeat within the timeout). The
        attempt stays held until its failure is committed; it retries at once."""
        if held.grace_until is not None and held.grace_until <= held.deadline:
            why = (
                f"the connection of Worker {held.worker_id} closed and it did not reconnect "
                f"within {self.dispatcher.reconnect_grace:g}s"
            )
        else:
            why = (
                f"no heartbeat from Worker {held.worker_id} for "
                f"{self.dispatcher.heartbeat_timeout:g}s"
            )
        error = AttemptError(message=why, attempt_progress=AttemptProgress.NOT_COMPLETED)
        aid = attempt_id(held.session_id, held.step_id, held.number)
        try:
            await self._retrying(
                "failing an attempt", lambda: self.fail(aid, error, backoff=False), attempt_id=aid
            )
        finally:
            self.dispatcher.unhold(aid, held)  # committed, or it had ended on its own

    async def hand_back_unreceived(self, held: Held) -> None:
        """A reconnected Worker did not name this attempt: it never received the hand-out,
        so the tool did not run. The Step queues again and uses no attempt."""
        aid = attempt_id(held.session_id, held.step_id, held.number)
        held.expiring = True
        try:
            await self._retrying(
                "handing back an attempt", lambda: self.hand_back(aid), attempt_id=aid
            )
        finally:
            self.dispatcher.unhold(aid, held)


@dataclass(eq=False)
class _Ended:
    """How an attempt ends, for its count once committed."""

    outcome: str
    progress: str | None
    step: Step | None = None


class _NotQueued(Exception):
    """A hand-out found its Step no longer queued: nothing to record."""


def _give_up(waiter: asyncio.Future[Turn | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _new_id(session_id: str | None) -> str:
    """The client's id, checked, or a new one: ``s_``, the milliseconds of the Unix time
    (12 hex digits) and 48 random bits (12 more). An id made in a later millisecond sorts
    later, so new sessions go to the end of the primary key's index as they do in the
    indexes on ``created_at``: a group commit of 64 creations writes a few pages of that
    index, not one each."""
    if session_id is None:
        return f"s_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"
    if not ID_PATTERN.fullmatch(session_id):
        raise InvalidInput("a session id is 1-128 letters, digits or _.:-", session_id=session_id)
    return session_id


def _recover(state: SessionState, now: float, *, spec: AgentSpec, reason: str) -> Transition:
    return handlers.recover(state, spec, now, reason)


def _validated(model: type[M], payload: dict[str, Any] | bytes) -> M:
    if isinstance(payload, bytes):
        return model.model_validate_json(payload)
    return model.model_validate(payload)


def _too_deep(payload: dict[str, Any] | bytes) -> bool:
    if not isinstance(payload, bytes):
        return too_deep(payload)
    # no JSON text with fewer brackets than the limit nests past it: skip the parse
    if payload.count(b"[") + payload.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return too_deep(msgspec.json.decode(payload))


def _parse(attempt: str) -> tuple[str, str, int]:
    try:
        return parse_attempt_id(attempt)
    except ValueError:
        raise NotFound(f"unknown attempt {attempt!r}") from None

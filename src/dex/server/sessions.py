"""The domain layer: each session is an actor that applies one input at a time.

An input (a user message, a Step result, a failed attempt, a hand-out) runs a
pure handler on the session's state, and the resulting transition is written
in one durable commit. Only then does anything outside learn of it: the caller
gets its answer, Workers get their Steps, waiters wake. A commit that fails
leaves the in-memory state behind: the actor is dropped and reloaded from
storage on next use.

A hot-path input is recorded and handled in that one commit. A wait's resolution
(an approval, a denial, an answer, a fired timer) takes two: the first records it
in the session's inbox (the caller's acknowledgement), the second runs the handler
that moves the turn on. A node that dies between them runs the handler on start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dex import _failpoints as failpoints
from dex.errors import Conflict, DexError, InvalidInput, NotFound
from dex.server import handouts, records, views
from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn
from dex.server.engine import handlers
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    AttemptError,
    SessionState,
    SessionStatus,
    Step,
    ToolCall,
    Turn,
    attempt_id,
    parse_attempt_id,
)
from dex.server.metrics import Metrics
from dex.server.store.base import SessionRow, Store
from dex.server.streams import MemoryStreams
from dex.wire import (
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
)

log = logging.getLogger("dex.sessions")

RECENT_TURNS = 4
ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
CALL_ID = re.compile(r"([1-9][0-9]{0,17})\.[1-9][0-9]{0,17}")
"""A tool call's id: its turn's number, a dot, its place in the turn."""
T = TypeVar("T")


@dataclass(eq=False)
class Actor:
    state: SessionState
    history_json: list[dict[str, Any]] = field(default_factory=list)
    """Each history item's JSON form, made once: a RunModel hand-out carries the history."""
    rows: records.Rows = field(default_factory=records.Rows)
    """What storage holds of the current turn's Steps and calls: a commit writes the rest."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    turn_waiters: dict[int, asyncio.Event] = field(default_factory=dict)
    ended: dict[int, Turn] = field(default_factory=dict)
    """The latest ended turns, as committed: a waiter gets its turn without a read."""
    chars: int = 0
    """Its state's and history's size as stored JSON: what the cache's size bound counts."""


class Sessions:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        streams: MemoryStreams | None = None,
        *,
        max_cached: int = 10_000,
        max_cached_chars: int = 64 << 20,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.clock = dispatcher.clock
        self.streams = streams or MemoryStreams()
        self.metrics = metrics or Metrics()
        self.max_cached = max_cached
        """How many idle sessions stay in memory; older idle ones reload from storage."""
        self.max_cached_chars = max_cached_chars
        """And how much of them, as stored JSON (in memory they take a few times that): a
        cache of long conversations holds fewer of them."""
        self._cached_chars = 0
        self.agents: dict[str, AgentSpec] = {}
        self._actors: OrderedDict[str, Actor] = OrderedDict()
        self._loading: dict[str, asyncio.Future[Actor]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
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

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- start -----------------------------------------------------------------------

    async def start(self, reason: str = "the server restarted", parallel: int = 1024) -> int:
        """Load agents, fail every attempt left running, apply recorded inputs, arm timers,
        and queue what was queued. Only the sessions in a turn are read: an idle one loads
        when it is first used. They recover ``parallel`` at a time, in two waves: every
        session of the wave is loaded (the reads reach the store together), then every one
        recovers (little work lies between two of their writes, so they share a few
        commits). Returns how many attempts were failed."""
        self.agents = {a.name: a for a in map(records.agent, await self.store.load_agents())}

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
            actors = await asyncio.gather(*(self._actor(s) for s in wave))
            failed += sum(await asyncio.gather(*(recover(a) for a in actors)))
        return failed

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
            actor = await self._actor(session_id)
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
        if session_id is None:
            session_id = "s_" + secrets.token_hex(8)
        elif not ID_PATTERN.fullmatch(session_id):
            raise InvalidInput(
                "a session id is 1-128 letters, digits or _.:-", session_id=session_id
            )
        state = SessionState(id=session_id, agent=agent, created_at=self.clock.now())
        try:
            await self.store.write(records.write(session=state, create=True))
        except Conflict:  # a new session's row conflicts only on its id
            raise Conflict(
                f"session {session_id!r} already exists", session_id=session_id
            ) from None
        return state

    async def list_rows(self, limit: int, after: str | None) -> list[SessionRow]:
        return await self.store.list_sessions(limit, after)

    async def send(self, session_id: str, text: str, message_id: str | None) -> tuple[int, bool]:
        """Returns (message number, whether this call created it)."""
        actor = await self._actor(session_id)
        async with actor.lock:
            if message_id is not None:
                known = await self.store.find_message(session_id, message_id)
                if known is not None:
                    return known, False
            spec = self._spec(actor.state.agent)
            result: list[int] = []

            def handle(s: SessionState, now: float) -> Transition:
                t, number = handlers.receive_message(s, spec, text, message_id, now)
                result.append(number)
                return t

            await self._apply_locked(actor, handle, message_id=message_id)
            return result[0], True

    async def wait_turn(self, session_id: str, number: int, timeout: float) -> Turn | None:
        """The turn once it has ended, or ``None`` if it runs past ``timeout``."""
        actor = await self._actor(session_id)
        if number < 1 or number > actor.state.messages_received:
            raise NotFound(f"session {session_id} has no turn {number}")
        deadline = time.monotonic() + timeout
        while True:
            turn = await self._ended_turn(actor, number)
            if turn is not None:
                return turn
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            event = actor.turn_waiters.setdefault(number, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return None

    async def _ended_turn(self, actor: Actor, number: int) -> Turn | None:
        turn = actor.state.turn
        if turn is not None and turn.number == number:
            return None
        if any(m.number == number for m in actor.state.queued):
            return None
        return actor.ended.get(number) or records.maybe_turn(
            await self.store.load_turn(actor.state.id, number)
        )

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        actor = await self._actor(session_id)
        state = actor.state
        waiting = []
        for step in state.queued_steps():
            serving = any(step.queue in w.queues for w in self.dispatcher.workers.values())
            waiting.append(
                {
                    "step_id": step.id,
                    "queue": step.queue,
                    "not_before": step.not_before,
                    "waiting_for": "backoff"
                    if step.not_before
                    else ("a free Worker" if serving else "a Worker that serves " + step.queue),
                }
            )
        return {
            "session": {
                "id": state.id,
                "agent": state.agent,
                "status": state.status.value,
                "created_at": state.created_at,
                "messages_received": state.messages_received,
                "queued_messages": views.plain(state.queued),
            },
            "current_turn": views.plain(state.turn) if state.turn else None,
            "waiting": waiting,
            "waits": [
                {
                    "step_id": step.id,
                    "type": step.type.value,
                    "call_id": step.tool_call_id,
                    "since": step.wait.since if step.wait else step.created_at,
                    "deadline": step.wait.deadline if step.wait else None,
                    "question": step.wait.question if step.wait else None,
                    "choices": step.wait.choices if step.wait else None,
                    "resolution_recorded": any(e["step_id"] == step.id for e in state.inbox),
                }
                for step in state.waiting_steps()
            ],
            "approvals": views.pending_approvals(state),
            "running": [
                {"attempt_id": aid, "worker_id": held.worker_id, "output_chars": held.output}
                for aid, held in self.dispatcher.held.items()
                if held.session_id == session_id
            ],
            "history": list(actor.history_json),
            "tool_calls": [
                {"turn": turn.number, **views.plain(call)}
                for turn in [
                    *map(records.turn, await self.store.load_turns(session_id)),
                    *filter(None, [state.turn]),
                ]
                for call in turn.tool_calls
            ],
        }

    # --- waits: approvals, answers, timers, cancel, reconcile ------------------------------

    async def resolve(self, session_id: str, entry: dict[str, Any]) -> None:
        """Record a wait's resolution durably (the caller's acknowledgement), then run the
        handler that moves the turn on in a second commit. A crash between the two runs
        the handler on start; the resolution stays recorded."""
        actor = await self._actor(session_id)

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
            await self.store.load_turn(actor.state.id, number)
        )
        call = turn.tool_call(call_id) if turn is not None else None
        return (turn, call) if turn is not None and call is not None else None

    async def fire_timer(self, session_id: str, step_id: str) -> None:
        async def fire() -> None:
            actor = await self._actor(session_id)
            step = actor.state.turn.step(step_id) if actor.state.turn else None
            if step is None or step.status != StepStatus.WAITING or step.tool_call_id is None:
                return  # fired already, or the turn ended
            await self.resolve(session_id, {"kind": "timer", "call_id": step.tool_call_id})

        await self._retrying("firing a timer", fire, session_id=session_id, step_id=step_id)

    async def _process_inbox(self, session_id: str) -> None:
        actor = await self._actor(session_id)
        spec = self._spec(actor.state.agent)

        def handle(s: SessionState, now: float) -> Transition:
            failpoints.hit("server.handler_running")
            return handlers.apply_input(s, spec, now)

        while actor.state.inbox:
            await self._apply(actor, handle)

    async def cancel(self, session_id: str, reason: str) -> int:
        """Cancel the running turn; returns its number."""
        actor = await self._actor(session_id)
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
        actor = await self._actor(session_id)
        async with actor.lock:
            state = actor.state
            turn = state.turn
            if turn is not None and turn.tool_call(call_id) is not None:
                updated: Turn | None = None
            else:
                ended = await self._ended_call(actor, call_id)
                if ended is None:
                    raise NotFound(f"session {session_id} has no tool call {call_id!r}")
                updated = turn = ended[0]
            call = turn.tool_call(call_id)
            assert call is not None

            def handle(s: SessionState, now: float) -> Transition:
                t = Transition()
                handlers.append_history(
                    s, t, handlers.reconcile(call, status, result, error, by, now)
                )
                return t

            # a failed commit drops the actor (and the loaded turn): nothing half-applied stays
            archived = (turn.number, call) if updated is not None else None
            await self._apply_locked(actor, handle, archived_call=archived)
            return call

    def workers_view(self) -> list[dict[str, Any]]:
        """The connected Workers: what they serve and what they run."""
        return views.workers(self.dispatcher, self.agents)

    async def approvals(self, session_id: str) -> list[dict[str, Any]]:
        return views.pending_approvals((await self._actor(session_id)).state)

    # --- Worker inputs -------------------------------------------------------------------

    async def assign(
        self, session_id: str, step_id: str, worker: WorkerConn
    ) -> dict[str, Any] | None:
        """Record a hand-out of a queued Step to ``worker``; None if it is not queued any more."""
        actor = await self._actor(session_id)
        async with actor.lock:
            step = actor.state.turn.step(step_id) if actor.state.turn else None
            if step is None or step.status != StepStatus.QUEUED:
                return None

            def handle(s: SessionState, now: float) -> Transition:
                handlers.assign(s, step_id, worker.id, now)
                return Transition()

            await self._apply_locked(actor, handle, dispatch=False)
            return self._handout(actor, step, worker)

    async def complete(self, attempt: str, payload: dict[str, Any]) -> None:
        failpoints.hit("server.before_commit_result")
        if too_deep(payload):
            raise InvalidInput(f"the result nests deeper than {MAX_JSON_DEPTH} levels")
        session_id, step_id, number = _parse(attempt)
        actor = await self._actor(session_id)
        spec = self._spec(actor.state.agent)
        step_type = _step_type(actor.state, step_id)

        def handle(s: SessionState, now: float) -> Transition:
            step = s.turn.step(step_id) if s.turn else None
            if step is not None and step.type == StepType.RUN_MODEL:
                response = ModelResponse.model_validate(payload)
                return handlers.complete_model(s, spec, step_id, number, response, now)
            if step is not None and step.type == StepType.COMPACT_CONTEXT:
                summary = Summary.model_validate(payload)
                return handlers.complete_summary(s, spec, step_id, number, summary, now)
            outcome = ToolOutcome.model_validate(payload)
            return handlers.complete_tool(s, spec, step_id, number, outcome, now)

        await self._apply(actor, handle, release=attempt)
        self.metrics.attempt_ended(step_type, "succeeded")
        failpoints.hit("server.after_commit_result")

    async def fail(
        self, attempt: str, error: RecoveryError | AttemptError, *, backoff: bool = True
    ) -> None:
        session_id, step_id, number = _parse(attempt)
        if isinstance(error, RecoveryError):
            error = AttemptError(
                message=error.message,
                attempt_progress=error.attempt_progress,
                retryable=error.retryable,
            )
        actor = await self._actor(session_id)
        spec = self._spec(actor.state.agent)
        await self._apply(
            actor,
            lambda s, now: handlers.fail_attempt(
                s, spec, step_id, number, error, now, backoff=backoff
            ),
            release=attempt,
        )
        self.metrics.attempt_ended(
            _step_type(actor.state, step_id), "failed", error.attempt_progress.value
        )

    async def hand_back(self, attempt: str) -> None:
        session_id, step_id, number = _parse(attempt)
        actor = await self._actor(session_id)
        await self._apply(
            actor, lambda s, now: handlers.hand_back(s, step_id, number), release=attempt
        )
        self.metrics.attempt_ended(_step_type(actor.state, step_id), "handed_back")

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

    # --- the actor machinery ---------------------------------------------------------------

    async def _actor(self, session_id: str) -> Actor:
        actor = self._actors.get(session_id)
        if actor is not None:
            self._actors.move_to_end(session_id)
            return actor
        pending = self._loading.get(session_id)
        if pending is not None:
            return await pending
        fut: asyncio.Future[Actor] = asyncio.get_running_loop().create_future()
        self._loading[session_id] = fut
        try:
            raw = await self.store.load_session(session_id)
            if raw is None:
                raise NotFound(f"unknown session {session_id!r}", session_id=session_id)
            state, history, rows = records.session(raw)
            actor = Actor(
                state=state,
                history_json=[item.model_dump(mode="json") for item in history],
                rows=rows,
                chars=sum(map(len, [raw.state, *raw.steps, *raw.calls, *raw.history])),
            )
            self._actors[session_id] = actor
            self._cached_chars += actor.chars
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
        """Forget the least recently used idle sessions beyond ``max_cached`` or
        ``max_cached_chars``. A session in a turn, one somebody waits on or works on, and
        the one just ``loaded`` stay."""
        excess = len(self._actors) - self.max_cached
        chars = self._cached_chars - self.max_cached_chars
        if excess <= 0 and chars <= 0:
            return
        idle: list[str] = []
        busy: list[str] = []
        for session_id, actor in self._actors.items():  # oldest first; stops at enough
            if excess <= 0 and chars <= 0:
                break
            in_use = actor.lock.locked() or actor.turn_waiters or actor.state.inbox
            if actor.state.status == SessionStatus.IDLE and not in_use and session_id != loaded:
                idle.append(session_id)
                excess -= 1
                chars -= actor.chars
            else:
                busy.append(session_id)
        for session_id in idle:
            self._cached_chars -= self._actors.pop(session_id).chars
        for session_id in busy:  # passed over once, not at every load: a load costs O(1)
            self._actors.move_to_end(session_id)

    async def _apply(
        self,
        actor: Actor,
        handle: Callable[[SessionState, float], Transition],
        *,
        release: str | None = None,
    ) -> None:
        async with actor.lock:
            await self._apply_locked(actor, handle, release=release)

    async def _apply_locked(
        self,
        actor: Actor,
        handle: Callable[[SessionState, float], Transition],
        *,
        message_id: str | None = None,
        dispatch: bool = True,
        archived_call: tuple[int, ToolCall] | None = None,
        release: str | None = None,
    ) -> None:
        """Run ``handle`` and commit its transition. ``release``: the attempt the input
        settled, let go once committed (before the transition hands anything out: a Step
        handed back may go out again under the same attempt id)."""
        if self._actors.get(actor.state.id) is not actor:
            raise Conflict("the session was reloaded; try again", retryable=True)
        state = actor.state
        now = self.clock.now()
        t = handle(state, now)
        # Hand a new Step to a Worker that is free right now in this same commit.
        handed: list[tuple[Step, WorkerConn]] = []
        if dispatch:
            for step in t.ready:
                if step.not_before is not None or step.status != StepStatus.QUEUED:
                    continue
                worker = self.dispatcher.reserve(step.queue)
                if worker is not None:
                    handlers.assign(state, step.id, worker.id, now)
                    handed.append((step, worker))
        start = state.history_length
        state.history_length += len(t.history)  # before encoding: the stored state counts them
        try:
            write = records.write(
                session=state,
                rows=actor.rows,
                history=t.history,
                history_start=start,
                ended_turn=t.ended_turn,
                message=(message_id, state.messages_received) if message_id else None,
                archived_call=archived_call,
            )
            await self.store.write(write)
        except BaseException:
            if self._actors.pop(state.id, None) is not None:  # memory ran ahead of storage
                self._cached_chars -= actor.chars
            for _, worker in handed:
                self.dispatcher.release(worker)
            raise
        actor.history_json.extend(item.model_dump(mode="json") for item in t.history)
        grown = sum(map(len, write.history))
        actor.chars += grown
        self._cached_chars += grown
        if release is not None:
            self.dispatcher.unhold(release)
        self._after_commit(actor, t, handed)

    def _after_commit(
        self, actor: Actor, t: Transition, handed: list[tuple[Step, WorkerConn]]
    ) -> None:
        sid = actor.state.id
        start = actor.state.history_length - len(t.history)
        for i, item in enumerate(t.history):
            self.streams.publish(
                sid, "history.item", {"index": start + i, "item": item.model_dump(mode="json")}
            )
        for change in t.events:
            self.streams.publish(sid, change["type"], change)
        for aid in t.cancel:
            held = self.dispatcher.unhold(aid)
            if held is not None:
                held.conn.send({"t": "cancel", "attempt_id": aid})
        handed_steps = {id(step) for step, _ in handed}
        for step in t.ready:
            if id(step) not in handed_steps and step.status == StepStatus.QUEUED:
                self.dispatcher.offer(sid, step.id, step.queue, step.not_before)
        for step, worker in handed:
            worker.send(self._handout(actor, step, worker))
        for step in t.timers:
            assert step.wait is not None and step.wait.deadline is not None
            self.dispatcher.arm_timer(sid, step.id, step.wait.deadline)
        if t.ended_turn is not None:
            self.metrics.turn_ended(t.ended_turn)
            actor.ended[t.ended_turn.number] = t.ended_turn
            while len(actor.ended) > RECENT_TURNS:
                del actor.ended[min(actor.ended)]
            event = actor.turn_waiters.pop(t.ended_turn.number, None)
            if event is not None:
                event.set()
            log.debug(
                "turn ended",
                extra={
                    "action": "turn.ended",
                    "session_id": sid,
                    "turn": t.ended_turn.number,
                    "status": t.ended_turn.status.value,
                },
            )

    def _handout(self, actor: Actor, step: Step, worker: WorkerConn) -> dict[str, Any]:
        state = actor.state
        attempt = step.attempts[-1]
        aid = attempt_id(state.id, step.id, attempt.number)
        if attempt.number == 1:
            self.metrics.child(self.metrics.queue_wait, step.queue).observe(
                max(0.0, attempt.started_at - step.created_at)
            )
        self.dispatcher.hold(
            worker,
            aid,
            Held(
                session_id=state.id,
                step_id=step.id,
                number=attempt.number,
                conn=worker,
                deadline=time.monotonic() + self.dispatcher.heartbeat_timeout,
            ),
        )
        return handouts.step_message(state, actor.history_json, step, aid, worker)


def _recover(state: SessionState, now: float, *, spec: AgentSpec, reason: str) -> Transition:
    return handlers.recover(state, spec, now, reason)


def _step_type(state: SessionState, step_id: str) -> str:
    step = state.turn.step(step_id) if state.turn else None
    return step.type.value if step is not None else "unknown"


def _parse(attempt: str) -> tuple[str, str, int]:
    try:
        return parse_attempt_id(attempt)
    except ValueError:
        raise NotFound(f"unknown attempt {attempt!r}") from None

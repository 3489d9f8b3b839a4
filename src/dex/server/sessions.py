"""The domain layer: what clients and the node's own timers ask of sessions, and recovery.

Each session is an actor (``actors``) that applies one input at a time: an input (a user
message, a Step result, a failed attempt, a hand-out) runs a pure handler
(``engine.handlers``) on the session's state, and the committer (``committer``) writes the
transition in one durable commit; only then does anything outside learn of it: the
caller gets its answer, Workers get their Steps, waiters wake. What a client reads is
built by ``views`` and read by ``reads``; what Workers do to attempts (hand-outs,
results, heartbeats, expiry) is in ``attempts``; what a Worker is handed is built by
``handouts``.

A hot-path input is recorded and handled in that one commit. A wait's resolution (an
approval, a denial, an answer, a fired timer) takes two: the first records it in the
session's inbox (the caller's acknowledgement), the second runs the handler that moves
the turn on. A node that dies between them runs the handler on start.

``Sessions`` builds the node's domain: its actors, committer, ``attempts`` and ``reads``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dex import _failpoints as failpoints
from dex.errors import Conflict, CorruptRecord, InvalidInput, NotFound, Unavailable
from dex.server import fleet, handouts, records
from dex.server.actors import Actor, Actors
from dex.server.attempts import Attempts
from dex.server.committer import Committer, Handle
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.dispatch.queues import Queued
from dex.server.engine import fork, handlers
from dex.server.engine.budget import Budget, Prices
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    SendOutcome,
    Sent,
    SessionState,
    Step,
    ToolCall,
    Turn,
    attempt_id,
)
from dex.server.flow import TenantBudgets
from dex.server.metrics import Metrics
from dex.server.reads import Reads
from dex.server.store.base import RememberedMessage, Store, Write
from dex.server.streams import MemoryStreams, Streams
from dex.wire import ITEMS, AgentSpec, OnBusy, StepStatus, StepType

if TYPE_CHECKING:
    from dex.server.tracing import Tracing  # OpenTelemetry: imported only when tracing is on

log = logging.getLogger("dex.sessions")

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
CALL_ID = re.compile(r"([1-9][0-9]{0,17})\.[1-9][0-9]{0,17}")
"""A tool call's id: its turn's number, a dot, its place in the turn."""


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
        prices: Prices | None = None,
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
        self.supervisor = dispatcher.supervisor
        self.agents: dict[str, AgentSpec] = {}
        """The registered agents, by name."""
        self.committer.queued = self._queued
        self.tenants = TenantBudgets(store, self.clock.now)
        """The tenants' budgets (read by ``app``, followed in a cluster)."""
        self.tenants.resume = self.recheck_budgets
        self.committer.tenants = self.tenants
        self.attempts = Attempts(
            self.committer, dispatcher, self.streams, self.metrics, self.spec, prices
        )
        """What Workers do to attempts."""
        self.reads = Reads(store, self.actors, self.streams, dispatcher, self.agents)
        """What clients read."""
        self.reads.tenants = self.tenants
        self.serves: Callable[[str], bool] | None = None
        """In a cluster, whether this node serves a session (its partition): a new
        session's id is made in one of this node's partitions. None: every session."""
        self.corrupt: set[str] = set()
        """Sessions whose stored records could not be read at start: they were not
        recovered (each answers ``corrupt_record``), every other one was."""

    async def stop(self) -> None:
        await self.supervisor.stop()

    # --- start -----------------------------------------------------------------------

    async def load_agents(self) -> None:
        """Read the registered agents from storage (other nodes' Workers register too)."""
        agents = self._readable_agents(await self.store.load_agents())
        self.agents.clear()  # ``reads`` reads this very dict
        self.agents.update((a.name, a) for a in agents)

    async def start(
        self,
        reason: str = "the server restarted",
        parallel: int = 1024,
        partitions: Callable[[str], bool] | None = None,
    ) -> int:
        """Load agents, fail every attempt left running, apply recorded inputs, arm timers,
        and queue what was queued. Only the sessions in a turn are read: an idle one loads
        when it is first used. They recover ``parallel`` at a time, in two waves: every
        session of the wave is loaded (the reads reach the store together), then every one
        recovers (little work lies between two of their writes, so they share a few
        commits). ``partitions``: only the sessions it takes (a node of a cluster that
        took some partitions). Returns how many attempts were failed."""
        if self.tracing is not None:
            self.tracing.started_at = self.clock.now()  # what ended before is the old node's
        await self.load_agents()

        async def recover(actor: Actor) -> int:
            session_id = actor.state.id
            queued = {step.id for step in actor.state.queued_steps()}
            running = await self._recover(actor, reason, reclaim=True)
            for step in actor.state.queued_steps():
                if step.id in queued:  # retries that recover() queued are offered already
                    self.dispatcher.offer(self._queued(actor.state, step), step.not_before)
            for step in actor.state.waiting_steps():
                if step.type == StepType.AWAIT_TIMER and step.wait and step.wait.deadline:
                    self.dispatcher.arm_timer(session_id, step.id, step.wait.deadline)
                if step.type == StepType.AWAIT_BUDGET and step.wait and step.wait.tenant:
                    self.tenants.held.add(step.wait.tenant)  # it may go on now: checked soon
            await self._process_inbox(session_id)
            return running

        sessions = await self.store.running_sessions()
        if partitions is not None:
            sessions = [s for s in sessions if partitions(s)]
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

    async def _recover(self, actor: Actor, reason: str, *, reclaim: bool = False) -> int:
        """Fail every attempt of the session that storage calls running (NOT_COMPLETED);
        returns how many. With ``reclaim`` (a start, a takeover), an attempt whose Worker
        may still run it waits for that Worker to reclaim it instead
        (``Dispatcher.await_reclaim``), and fails only if it does not in time."""
        state, dispatcher = actor.state, self.dispatcher
        kept = set()
        if reclaim and dispatcher.reclaim_window > 0:
            for step in state.running_steps():
                attempt = step.current
                if attempt is None or not attempt.proof:
                    continue  # handed out before attempts kept a proof
                aid = attempt_id(state.id, step.id, attempt.number)
                kept.add(step.id)
                if aid not in dispatcher.held:
                    dispatcher.await_reclaim(
                        aid,
                        session_id=state.id,
                        step_id=step.id,
                        number=attempt.number,
                        worker_id=attempt.worker_id,
                        proof=attempt.proof,
                    )
                    ask = self._queued(state, step).ask
                    if ask is not None:  # it may run on: it counts against its limits
                        dispatcher.limits.count(state.id, step.id, ask)
        types = [step.type.value for step in state.running_steps() if step.id not in kept]
        if types:
            spec = self.spec(state.agent)
            recover = functools.partial(_recover, spec=spec, reason=reason, kept=frozenset(kept))
            await self.committer.apply(actor, lambda _: recover)
            for step_type in types:
                self.metrics.attempt_ended(step_type, "failed", "NOT_COMPLETED")
        return len(types)

    async def fail_held(self, reason: str, only: Callable[[str], bool] | None = None) -> int:
        """Fail every attempt a Worker still holds (``only``: of the sessions it takes), as
        a node stopping does (group commit makes it one transaction, or few). Returns how
        many failed."""
        by_session: dict[str, list[str]] = {}
        for aid, held in self.dispatcher.held.items():
            if only is None or only(held.session_id):
                by_session.setdefault(held.session_id, []).append(aid)

        async def fail_session(session_id: str, held: list[str]) -> int:
            actor = await self.actors.get(session_id)
            running = await self._recover(actor, reason)
            for aid in held:
                self.dispatcher.unhold(aid)
            return running

        counts = await asyncio.gather(*(fail_session(s, a) for s, a in by_session.items()))
        return sum(counts)

    def forget(self, which: Callable[[str], bool]) -> None:
        """Drop the sessions ``which`` takes from memory (a cluster node handed their
        partition over): who waits on one hears now, and a later use loads it again."""
        for actor in self.actors.actors():
            if which(actor.state.id):
                actor.wake_all()
                self.actors.drop(actor)

    # --- agents ------------------------------------------------------------------------

    async def register_agents(self, specs: list[AgentSpec]) -> None:
        changed = [s for s in specs if self.agents.get(s.name) != s]
        if changed:
            await self.store.write(records.write(agents=changed))
            for spec in changed:
                self.agents[spec.name] = spec

    def _queued(self, state: SessionState, step: Step) -> Queued:
        """``step`` queued, with what its hand-out asks of the limits (nothing while its
        agent is not registered: no Worker serves it yet)."""
        return handouts.queued(state, step, self.agents.get(state.agent))

    def spec(self, agent: str) -> AgentSpec:
        spec = self.agents.get(agent)
        """The agent's spec; ``NotFound`` if no Worker has registered it."""
        if spec is None:
            raise NotFound(
                f"unknown agent {agent!r}: no Worker has registered it; start a Worker that "
                f"defines it (dex worker MODULE), then try again",
                agent=agent,
            )
        return spec

    # --- client inputs ------------------------------------------------------------------

    async def create(
        self,
        agent: str,
        session_id: str | None,
        tenant: str | None = None,
        priority: int = 0,
        budget: Budget | None = None,
    ) -> SessionState:
        """A new session of ``agent`` (``tenant``: whose it is, for good; ``priority``: its
        place among its tenant's sessions in the queues; ``budget``: what it may use in
        all)."""
        if agent not in self.agents and self.serves is not None:
            await self.load_agents()  # in a cluster: a Worker of another node registered it
        self.spec(agent)
        if tenant is not None and not fleet.TENANT.fullmatch(tenant):
            raise InvalidInput(f"a tenant is {fleet.TENANT_RULE}", tenant=tenant)
        now = self.clock.now()
        new_id = _new_id(session_id)
        if session_id is None and self.serves is not None:
            new_id = self._own_id(new_id)
        state = SessionState(
            id=new_id,
            agent=agent,
            created_at=now,
            updated_at=now,
            tenant=tenant,
            priority=priority,
            budget=budget,
        )
        await self._write_new(records.new_session(state))
        return state

    def _own_id(self, new_id: str) -> str:
        """A new id in one of this node's partitions (a few tries: it serves one of every
        few); ``Unavailable`` if it serves none now."""
        assert self.serves is not None
        for _ in range(10_000):
            if self.serves(new_id):
                return new_id
            new_id = _new_id(None)
        raise Unavailable("this node serves no partition now: try another node")

    async def fork(self, session_id: str, before: int, new_id: str | None) -> SessionState:
        """A new session whose history is this one's before turn ``before``
        (``engine.fork``); the original is only read."""
        actor = await self.actors.get(session_id)
        await actor.acquire()  # a consistent view: no input moves it while it is read
        try:
            ended = [records.turn(raw) for raw in await self.store.load_turns(session_id)]
            history = ITEMS.validate_python(actor.history_json)
            fork_id = _new_id(new_id)
            if new_id is None and self.serves is not None:
                fork_id = self._own_id(fork_id)
            state, history, turns = fork.fork(
                actor.state, history, ended, before, fork_id, self.clock.now()
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

    async def send(
        self,
        session_id: str,
        text: str,
        message_id: str | None,
        on_busy: OnBusy | None = None,
    ) -> tuple[Sent, bool]:
        """A user message (``on_busy``: what it does if a turn runs; None: the agent's
        policy). Returns what it did, and whether this call did it: a ``message_id`` sent
        before answers what its first send did, and changes nothing. A refused send
        (``reject``) is not remembered: sent again, it is decided again."""
        if message_id is None:
            message = functools.partial(self._message, text, None, on_busy)
            t = await self.committer.apply(session_id, message)
            assert t.sent is not None
            return t.sent, True
        actor = await self.actors.get(session_id)
        await actor.acquire()  # no other input between the look-up and the commit
        try:
            known = await self.store.find_message(session_id, message_id)
            handle = None if known is not None else self._message(text, message_id, on_busy, actor)
        except BaseException:
            actor.release()
            raise
        if known is not None:
            actor.release()
            return _sent(known), False
        assert handle is not None
        t = await self.committer.commit(actor, handle, message_id=message_id)
        assert t.sent is not None
        return t.sent, True

    def _message(
        self, text: str, message_id: str | None, on_busy: OnBusy | None, actor: Actor
    ) -> Handle:
        spec = self.spec(actor.state.agent)

        return lambda s, now: handlers.receive_message(s, spec, text, message_id, now, on_busy)[0]

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
            await self.committer.apply(actor, lambda _: record)
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
        self.supervisor.spawn(
            self.supervisor.retrying(
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

        await self.supervisor.retrying(
            "firing a timer", fire, session_id=session_id, step_id=step_id
        )

    async def _process_inbox(self, session_id: str) -> None:
        actor = await self.actors.get(session_id)
        spec = self.spec(actor.state.agent)

        def handle(s: SessionState, now: float) -> Transition:
            failpoints.hit("server.handler_running")
            return handlers.apply_input(s, spec, now)

        while actor.state.inbox:
            await self.committer.apply(actor, lambda _: handle)

    async def set_budget(
        self, session_id: str, budget: Budget | None, by: str | None
    ) -> SessionState:
        """Change the session's budget (None: no limit), in one commit with what it moves
        on: a turn that waited for its budget and may go on now queues its model call."""
        actor = await self.actors.get(session_id)
        spec = self.spec(actor.state.agent)

        def handle(s: SessionState, now: float) -> Transition:
            return handlers.set_budget(s, spec, budget, by, now, self._tenant_reason(s, now))

        await self.committer.apply(actor, lambda _: handle)
        return actor.state

    async def recheck_budgets(self, tenant: str, by: str | None = None) -> None:
        """``tenant``'s budget allows more now (raised, removed, a new day or month): the
        turns of its sessions this node serves that wait for a budget go on, each in one
        commit, where their own session's budget allows it too."""
        before: tuple[float, str] | None = None
        while page := await self.store.waiting_sessions(500, before, tenant):
            before = (page[-1][1], page[-1][0])
            for session_id, _ in page:
                if not self.dispatcher.dispatches(session_id):
                    continue  # another node serves it, and rechecks it
                try:
                    build = functools.partial(self._recheck_budget, by=by)
                    await self.committer.apply(session_id, build)
                except (NotFound, Conflict):
                    continue  # it waits for something else, or no longer at all
                except Unavailable:  # reloaded meanwhile: try again at the next check
                    self.tenants.held.add(tenant)

    def _recheck_budget(self, actor: Actor, by: str | None) -> Handle:
        state = actor.state
        if not any(
            step.type == StepType.AWAIT_BUDGET and step.wait and step.wait.tenant
            for step in state.waiting_steps()
        ):
            raise Conflict(f"session {state.id} does not wait for its tenant's budget")
        spec = self.spec(state.agent)

        def handle(s: SessionState, now: float) -> Transition:
            return handlers.recheck_budget(s, spec, self._tenant_reason(s, now), by, now)

        return handle

    def _tenant_reason(self, state: SessionState, now: float) -> str | None:
        held = self.tenants.reached(state.tenant, now) if state.tenant is not None else None
        return held[0] if held is not None else None

    async def cancel(self, session_id: str, reason: str) -> int:
        """Cancel the running turn; returns its number."""
        actor = await self.actors.get(session_id)
        spec = self.spec(actor.state.agent)
        number: list[int] = []

        def handle(s: SessionState, now: float) -> Transition:
            if s.turn is None:
                raise Conflict(f"session {session_id} has no running turn")
            number.append(s.turn.number)
            return handlers.cancel_turn(s, spec, now, reason)

        await self.committer.apply(actor, lambda _: handle)
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
        await self.committer.commit(
            actor, handle, archived_call=(turn.number, call) if archived else None
        )
        return call


def _sent(known: RememberedMessage) -> Sent:
    """What a remembered send did; one remembered before outcomes were started or queued its
    turn (which of the two is not known: queued says that the turn answers it)."""
    outcome = SendOutcome(known.outcome) if known.outcome else SendOutcome.QUEUED
    return Sent(turn=known.number, outcome=outcome, interrupted=known.interrupted)


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


def _recover(
    state: SessionState, now: float, *, spec: AgentSpec, reason: str, kept: frozenset[str]
) -> Transition:
    return handlers.recover(state, spec, now, reason, kept)

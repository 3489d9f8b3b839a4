"""The committer: runs an input's handler on a session's actor, commits the transition, and
only then lets anything outside learn of it. The one place effects run after a commit.

``apply`` is the way in: it waits its turn on the session's actor (``Actor.run_when_free``:
inputs apply in the order they are given), builds the handler holding it, and commits.
``commit`` is called holding the actor (``apply``, or a caller that ``acquire``d it). It runs
the handler on the state in memory, hands the Steps that became ready to Workers that are
free right now (recorded in the same commit, so a hand-out is durable before the Worker
hears of it), and gives the write to the store's group commit without waiting for it.
When the commit is durable the settled attempt is let go and the returned future resolves
(its callbacks run later, so an answer it sends is queued ahead of the effects' messages
and shares their frame); then the effects run, in this order: events are published,
cancelled attempts are told to stop, Steps are offered or handed out, timers are armed,
the ended turn wakes its waiters; then the actor is released. A handler that refuses
(``NotFound``, ``Conflict``) changes nothing. A commit that fails leaves the state in
memory ahead of storage: the actor is dropped and reloads from storage on next use, and
the future carries the error.

Nothing here awaits: an input costs a handler, an encoding and a place in the next group
commit, however many arrive at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from dex.errors import Unavailable
from dex.server import handouts, records
from dex.server.actors import Actor, Actors
from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn
from dex.server.dispatch.queues import Queued
from dex.server.engine import handlers
from dex.server.engine.handlers import Transition
from dex.server.engine.state import SessionState, Step, ToolCall, attempt_id
from dex.server.engine.turn import hold_for_tenant
from dex.server.flow import TenantBudgets, day_of
from dex.server.metrics import Metrics
from dex.server.store.base import RememberedMessage, Store, TenantUsage
from dex.server.streams import Streams
from dex.wire import StepStatus, server_frames

if TYPE_CHECKING:
    from dex.server.tracing import Tracing  # OpenTelemetry: imported only when tracing is on

log = logging.getLogger("dex.sessions")

Handle = Callable[[SessionState, float], Transition]
"""A handler bound to its input: (state, now) -> transition."""
Build = Callable[[Actor], Handle]
"""Builds the handler, called holding the session's actor (it may read its state)."""


class Committer:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        actors: Actors,
        streams: Streams,
        metrics: Metrics,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.tracing = tracing
        self.dispatcher = dispatcher
        self.clock = dispatcher.clock
        self.actors = actors
        self.streams = streams
        self.metrics = metrics
        self.queued: Callable[[SessionState, Step], Queued] = handouts.queued
        """A queued Step as the dispatcher holds it, with what its hand-out asks of the
        limits (``handouts.queued``, given the session's agent: ``Sessions`` sets it)."""
        self.tenants: TenantBudgets | None = None
        """The tenants' budgets: a model call a handler queues for a session whose tenant's
        budget is used up waits instead (``Sessions`` sets it)."""

    def apply(
        self, session: str | Actor, build: Build, **options: Any
    ) -> asyncio.Future[Transition]:
        """Apply an input as soon as the session's actor is free: ``build`` (called holding
        it) returns the handler; the future resolves once its commit is durable (``commit``
        says when its callbacks run). Inputs given for one session apply in the order they
        were given, and one whose session is in memory costs no task. ``session``: its id,
        or the actor the caller read (refused with ``Conflict`` if it was dropped since).
        ``build`` raising releases the actor and fails the future; ``options`` are
        ``commit``'s."""
        actor = session if isinstance(session, Actor) else self.actors.cached(session)
        if actor is None:
            return asyncio.ensure_future(self._loaded(str(session), build, options))
        return self._when_free(actor, build, options)

    async def _loaded(self, session_id: str, build: Build, options: dict[str, Any]) -> Transition:
        actor = await self.actors.get(session_id)
        return await self._when_free(actor, build, options)

    def _when_free(
        self, actor: Actor, build: Build, options: dict[str, Any]
    ) -> asyncio.Future[Transition]:
        done: asyncio.Future[Transition] = asyncio.get_running_loop().create_future()

        def run() -> None:
            try:
                handle = build(actor)
            except BaseException as e:
                actor.release()
                done.set_exception(e)
                return
            self.commit(actor, handle, done=done, **options)

        actor.run_when_free(run)
        return done

    def commit(
        self,
        actor: Actor,
        handle: Handle,
        *,
        message_id: str | None = None,
        dispatch: bool = True,
        archived_call: tuple[int, ToolCall] | None = None,
        release: str | None = None,
        done: asyncio.Future[Transition] | None = None,
    ) -> asyncio.Future[Transition]:
        """Apply ``handle`` to the actor the caller holds and commit it; the future resolves
        with the transition once it is durable (its callbacks run after the effects), and
        the actor is let go once the effects ran (or at once, if the handler refuses).
        ``message_id``: the client message id to remember. ``dispatch``: hand new Steps to
        free Workers in this commit.
        ``archived_call``: an archived turn's call the handler changed. ``release``: the
        attempt the input settled, let go once committed (before the transition hands
        anything out: a Step handed back may go out again under the same attempt id).
        ``done``: the future to resolve (a new one by default)."""
        if done is None:
            done = asyncio.get_running_loop().create_future()
        if not self.actors.owns(actor):
            actor.release()
            if not done.done():
                done.set_exception(_reloaded())
            return done
        state = actor.state
        now = self.clock.now()
        try:
            t = handle(state, now)
        except BaseException as e:  # refused: the handler changed nothing
            actor.release()
            if not done.done():
                done.set_exception(e)
            return done
        used = None
        if state.tenant is not None:
            tenants = self.tenants
            if t.ready and tenants is not None and (held := tenants.reached(state.tenant, now)):
                reason, budget = held
                hold_for_tenant(state, t, msgspec.to_builtins(budget), reason, now)
            if t.used is not None:
                day = tenants.day(now) if tenants is not None else day_of(now)
                used = TenantUsage(state.tenant, day, *t.used)
        if dispatch:
            handed, waiting = self._hand_out_now(state, t, now)
        else:
            handed, waiting = [], [(step, None) for step in t.ready]
        if self.tracing is not None:
            self.tracing.before_commit(state)
        start = state.history_length
        state.history_length += len(t.history)  # before encoding: the stored state counts them
        state.updated_at = now
        try:
            plain = records.plain_history(t.history)
            write = records.write(
                session=state,
                rows=actor.rows,
                history=t.history,
                history_plain=plain,
                history_start=start,
                ended_turn=t.ended_turn,
                message=_remembered(message_id, t),
                archived_call=archived_call,
            )
            write.tenant_usage = used
            stored = self.store.submit(write)
        except BaseException as e:
            self._failed(actor, handed, e, done)
            return done
        grown = sum(map(len, write.history))
        stored.add_done_callback(
            functools.partial(
                self._committed, actor, t, handed, waiting, release, done, plain, grown, used
            )
        )
        return done

    def _hand_out_now(
        self, state: SessionState, t: Transition, now: float
    ) -> tuple[list[tuple[Step, WorkerConn]], list[tuple[Step, Queued | None]]]:
        """Record, in this commit, the hand-out of each new Step to a Worker free right now:
        (the Steps handed out and their Workers, the other ready Steps with the ``Queued``
        built for them here, or None, for the effects to offer)."""
        handed: list[tuple[Step, WorkerConn]] = []
        if not self.dispatcher.dispatches(state.id):
            # its partition is being handed over: the next owner hands it out
            return handed, [(step, None) for step in t.ready]
        waiting: list[tuple[Step, Queued | None]] = []
        for step in t.ready:
            if step.not_before is not None or step.status != StepStatus.QUEUED:
                waiting.append((step, None))
                continue
            queued = self.queued(state, step)
            worker = self.dispatcher.reserve(step.queue, state.id, step.id, queued.ask)
            if worker is not None:
                handlers.assign(state, step.id, worker.id, now, worker.proof)
                handed.append((step, worker))
            else:
                waiting.append((step, queued))
        return handed, waiting

    def _failed(
        self,
        actor: Actor,
        handed: list[tuple[Step, WorkerConn]],
        error: BaseException,
        done: asyncio.Future[Transition],
    ) -> None:
        self.actors.drop(actor)  # the state in memory ran ahead of storage
        for step, worker in handed:
            self.dispatcher.release(worker, actor.state.id, step.id)
        actor.release()
        if not done.done():
            done.set_exception(error)

    def _committed(
        self,
        actor: Actor,
        t: Transition,
        handed: list[tuple[Step, WorkerConn]],
        waiting: list[tuple[Step, Queued | None]],
        release: str | None,
        done: asyncio.Future[Transition],
        plain: list[dict[str, Any]],
        grown: int,
        used: TenantUsage | None,
        stored: asyncio.Future[None],
    ) -> None:
        error = asyncio.CancelledError() if stored.cancelled() else stored.exception()
        if error is not None:
            self._failed(actor, handed, error, done)
            return
        try:
            actor.history_json.extend(plain)
            self.actors.grew(actor, grown)
            if release is not None:
                self.dispatcher.unhold(release)
            if used is not None:
                self.metrics.tenant_used(used)
                if self.tenants is not None:
                    self.tenants.counted(used)
            # durable: resolve before the effects, so that the answer (a Worker's ack) is
            # queued ahead of what the effects send and leaves in the same frame as the
            # next hand-out; whoever awaits it runs later, when the effects have run
            if not done.done():
                done.set_result(t)
            self._effects(actor, t, handed, waiting)
        except BaseException as e:  # a bug: the commit stands, the actor reloads from it
            log.exception("effects of a commit failed", extra={"action": "sessions.effects"})
            self._failed(actor, [], e, done)
            return
        actor.release()

    def _effects(
        self,
        actor: Actor,
        t: Transition,
        handed: list[tuple[Step, WorkerConn]],
        waiting: list[tuple[Step, Queued | None]],
    ) -> None:
        sid = actor.state.id
        if self.tracing is not None:
            self.tracing.after_commit(actor.state, t.ended_turn)
        history = actor.history_json
        if t.history:
            self.streams.publish_history(sid, history, len(history) - len(t.history))
        for change in t.events:
            self.streams.publish(sid, change["type"], change)
        for call, step in t.unknown:
            _log_unknown(sid, call, step)
        for aid in t.cancel:
            held = self.dispatcher.unhold(aid)
            if held is not None:
                held.conn.send(server_frames.Cancel(attempt_id=aid))
        for step, queued in waiting:  # the ready Steps not handed out
            if step.status == StepStatus.QUEUED:
                if queued is None:
                    queued = self.queued(actor.state, step)
                self.dispatcher.offer(queued, step.not_before)
        for step, worker in handed:
            worker.send(self.handout(actor, step, worker))
        for step in t.timers:
            assert step.wait is not None and step.wait.deadline is not None
            self.dispatcher.arm_timer(sid, step.id, step.wait.deadline)
        if actor.turn_waiters:
            actor.wake_if_waiting()
        if t.ended_turn is not None:
            self.metrics.turn_ended(t.ended_turn)
            actor.remember(t.ended_turn)
            log.debug(
                "turn ended",
                extra={
                    "action": "turn.ended",
                    "session_id": sid,
                    "turn": t.ended_turn.number,
                    "status": t.ended_turn.status.value,
                },
            )

    def handout(self, actor: Actor, step: Step, worker: WorkerConn) -> server_frames.Step:
        """Hold the Step's latest attempt for ``worker``, and the ``step`` message to send."""
        state = actor.state
        attempt = step.attempts[-1]
        aid = attempt_id(state.id, step.id, attempt.number)
        if attempt.number == 1:
            self.metrics.queue_wait.observe(
                max(0.0, attempt.started_at - step.created_at), step.queue
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
        traceparent = self.tracing.traceparent(state.id, aid) if self.tracing is not None else None
        return handouts.step_message(state, actor.history_json, step, aid, worker, traceparent)


def _log_unknown(session_id: str, call: ToolCall, step: Step) -> None:
    """The warning that a tool call's outcome became unknown: a person must reconcile it."""
    why = unknown_why(step)
    log.warning(
        "tool call %s %s: the outcome is unknown, the tool may have run (%s); reconcile it: "
        "dex reconcile %s %s --status succeeded|failed",
        call.id,
        call.name,
        why,
        session_id,
        call.id,
        extra={
            "action": "tool_call.outcome_unknown",
            "session_id": session_id,
            "call_id": call.id,
            "tool": call.name,
            "step_id": step.id,
            "why": why,
        },
    )


def unknown_why(step: Step) -> str:
    """Why a tool call's outcome is unknown: how its last attempt failed, and why it is
    not tried again."""
    last = step.attempts[-1] if step.attempts else None
    error = step.error or (last.error if last is not None else None)
    message = error.message if error is not None else "it failed"
    progress = f" {error.attempt_progress.value}" if error is not None else ""
    failed = f"attempt {last.number} failed{progress}: {message}" if last else message
    used = len(step.attempts[step.poll_start :])
    if step.status == StepStatus.CANCELLED:
        limit = "the turn was cancelled while it ran"
    elif error is not None and not error.retryable:
        limit = "not retryable"
    elif step.retry.max_attempts == 1:
        limit = "a single attempt allowed"
    elif used >= step.retry.max_attempts:
        limit = f"all {step.retry.max_attempts} attempts used"
    else:
        limit = f"its retry window of {step.retry.within_seconds:g}s passed"
    return f"{failed}; {limit}"


def _reloaded() -> Exception:
    """Nothing was committed: the session's memory was dropped (a commit of it failed, or
    its partition was handed over) while this input waited. A 503 (``Unavailable``): the
    caller tries again, on this node or the one that serves the session now."""
    return Unavailable("the session was reloaded; try again", retryable=True)


def _remembered(message_id: str | None, t: Transition) -> RememberedMessage | None:
    """What a send with a client message id did, to remember (``Store.find_message``)."""
    if message_id is None or t.sent is None:
        return None
    sent = t.sent
    return RememberedMessage(message_id, sent.turn, sent.outcome.value, sent.interrupted)

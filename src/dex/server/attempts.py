"""What Workers do to attempts: a connection's hello and welcome, hand-outs (``assign``),
results (``complete``, ``fail``, ``hand_back``), heartbeats and the single-attempt start
acknowledgement they answer, live text, and the ends the node decides itself (``expire``,
``hand_back_unreceived``). The Worker channel (``api.workers``) reads frames off the
socket and gives each message here (``Link.receive``); everything sent back is a struct
of ``dex.wire.server_frames``, batched by the connection's ``Outbox`` into one frame per
event-loop turn and encoded with msgspec.

An attempt is settled in one commit: ``complete``, ``fail`` and ``hand_back`` return a
future at once (``Committer.apply``), so one frame's results join one group commit without
a task each, and the Worker's ``ack`` answers each once it is durable. Which handler a
result runs is the Step type's (``_COMPLETE``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import msgspec
from pydantic import BaseModel, ValidationError

from dex import _failpoints as failpoints
from dex.errors import DexError, InvalidInput, NotFound
from dex.server.actors import Actor
from dex.server.committer import Committer, Handle
from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn, WorkerIdInUse
from dex.server.engine import handlers
from dex.server.engine.budget import Prices, model_name
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    AttemptError,
    SessionState,
    Step,
    attempt_id,
    parse_attempt_id,
)
from dex.server.metrics import Metrics
from dex.server.streams import Streams
from dex.server.supervisor import Supervisor
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
    Usage,
    server_frames,
    too_deep,
    worker_frames,
)
from dex.wire.outbox import Outbox
from dex.wire.server_frames import Ack, Claimed, HeartbeatReply, Members, ServerMessage, Welcome
from dex.wire.worker_frames import (
    Back,
    Claim,
    Delta,
    Done,
    Drain,
    Fail,
    Heartbeat,
    Hello,
    WorkerMessage,
)

log = logging.getLogger("dex.workers")

M = TypeVar("M", bound=BaseModel)

Failure = RecoveryError | worker_frames.RecoveryError | AttemptError
"""Why an attempt failed: from the API or a Worker's frame, or the server's own."""

_COMPLETE: dict[StepType, tuple[type[BaseModel], Callable[..., Transition]]] = {
    StepType.RUN_MODEL: (ModelResponse, handlers.complete_model),
    StepType.COMPACT_CONTEXT: (Summary, handlers.complete_summary),
}
"""The type a Step's result is validated by, and the handler that commits it."""
_COMPLETE_TOOL: tuple[type[BaseModel], Callable[..., Transition]] = (
    ToolOutcome,
    handlers.complete_tool,
)
"""Every other Step's (a tool call's), and an attempt's whose Step is gone (it refuses)."""

_RESULTS: dict[type, str] = {Done: "done", Fail: "fail", Back: "back"}
"""Each result message's ``t``, as refusals name it."""


class Wire(Protocol):
    """The socket of one Worker connection, as the outbox writes to it."""

    async def send(self, frame: bytes) -> None: ...


@dataclass(eq=False)
class Link:
    """One Worker connection as the attempts see it: what its messages do, and its outbox."""

    attempts: Attempts
    worker: WorkerConn
    outbox: Outbox[ServerMessage]
    lease_valid: Callable[[], bool]
    """Whether answers from memory (heartbeat replies, start acks, live text) may be given."""
    writer: asyncio.Task[None]
    stopped: int
    """Attempts the hello claimed that the node does not run any more (``welcome.stop``)."""
    handed_back: int
    """Attempts a reconnected Worker did not name: it never received them."""

    @property
    def worker_id(self) -> str:
        return self.worker.id

    @property
    def held(self) -> int:
        return len(self.worker.attempts)

    def receive(self, message: WorkerMessage) -> None:
        """Act on one message, in the order they came; a result's commit joins the next
        group commit and answers with an ``ack`` when it is done, without holding up the
        next message."""
        worker, outbox = self.worker, self.outbox
        dispatcher = self.attempts.dispatcher
        if isinstance(message, Heartbeat):
            if not self.lease_valid():
                return  # not sure it still leads: no "ok" from a node that may be replaced
            # a heartbeat's "ok" is also the start acknowledgement of a single-attempt tool
            status = self.attempts.heartbeat(worker, message.attempts)
            outbox.put(HeartbeatReply(status=status, seq=message.seq))
            return
        if isinstance(message, Delta):
            held = dispatcher.owned(worker, message.attempt_id)
            if held is None:
                dispatcher.refuse(worker, message.attempt_id, "delta")
                return
            if not self.lease_valid():
                return  # a node that may be replaced publishes no text: its successor discards it
            dispatcher.heartbeat(worker, message.attempt_id)
            held.output += len(message.text)
            self.attempts.streams.publish(
                held.session_id,
                "model.delta",
                {"attempt_id": message.attempt_id, "step_id": held.step_id, "text": message.text},
            )
            return
        if isinstance(message, Drain):
            worker.draining = True
            return
        if isinstance(message, Claim):
            if not self.lease_valid():
                return  # as for a heartbeat: no "ok" from a node that may be replaced
            status = self.attempts.claim(worker, message.attempts)
            if status:
                outbox.put(Claimed(status=status))
            return
        assert isinstance(message, Done | Fail | Back)
        attempt = message.attempt_id
        if dispatcher.owned(worker, attempt) is None:
            reason = dispatcher.refuse(worker, attempt, _RESULTS[type(message)])
            outbox.put(Ack(attempt_id=attempt, ok=False, error=reason))
            return
        try:
            if isinstance(message, Done):
                done = self.attempts.complete(attempt, bytes(message.result))
                dispatcher.lift(worker)
            elif isinstance(message, Fail):
                done = self.attempts.fail(attempt, message.error)
                dispatcher.lift(worker)
            else:
                limited = message.reason == "rate_limited"
                if message.reason == "history":  # it lacks the prefix: send the whole view next
                    held = dispatcher.held[attempt]
                    worker.history_sent.pop(held.session_id, None)
                elif limited:  # the model provider's limit, not the Worker's capacity
                    dispatcher.lift(worker)
                elif not worker.draining:  # full: its capacity is taken on other nodes
                    dispatcher.back_off(worker)
                done = self.attempts.hand_back(attempt, limited, message.retry_after)
        except Exception as e:
            _answer(attempt, outbox, worker.id, e)
            self._refused(message, e)
            return
        done.add_done_callback(functools.partial(self._answered, message))

    def _answered(self, message: Done | Fail | Back, done: asyncio.Future[Any]) -> None:
        _acked(message.attempt_id, self.outbox, self.worker.id, done)
        if done.cancelled():
            self._refused(message, asyncio.CancelledError())
        elif done.exception() is not None:
            self._refused(message, done.exception())

    def _refused(self, message: Done | Fail | Back, error: BaseException | None) -> None:
        """A result was refused, and the Worker forgets the attempt (``ack``): its body ran
        (a ``done`` or ``fail``), so a reconnect that does not name it must not hand it
        back as one the Worker never received. A result that could not be recorded (a
        full disk) fails it now; a bad one changes nothing, and the attempt runs on until
        a good result or its deadline."""
        if not isinstance(message, Back):
            why = str(error) or type(error).__name__
            bad = isinstance(error, InvalidInput | ValidationError)
            self.attempts.dispatcher.let_go(self.worker, message.attempt_id, why, fail=not bad)

    def disconnect(self) -> None:
        """The connection closed: send nothing more; its attempts wait for the Worker to
        reconnect (``Dispatcher.disconnect``)."""
        self.outbox.closed = True
        self.attempts.dispatcher.disconnect(self.worker)
        self.writer.cancel()


class Attempts:
    def __init__(
        self,
        committer: Committer,
        dispatcher: Dispatcher,
        streams: Streams,
        metrics: Metrics,
        spec: Callable[[str], AgentSpec],
        prices: Prices | None = None,
    ) -> None:
        self.committer = committer
        self.dispatcher = dispatcher
        self.supervisor: Supervisor = dispatcher.supervisor
        self.streams = streams
        self.metrics = metrics
        self.spec = spec
        """The agent's registered spec (``Sessions.spec``: ``NotFound`` if none is)."""
        self.prices = prices or Prices()
        """What a model call costs: committed with its result (``engine.budget``)."""
        self.members: Callable[[], list[str]] = lambda: []
        """In a cluster: the base URLs of the nodes a Worker should be connected to, this
        one included (``welcome.members``); empty on a single node."""
        self.recovered: Callable[[str], bool] = lambda session_id: True
        """Whether this node owns the session, recovered: an attempt of it that the node
        does not hold runs nowhere. In a cluster a Worker may ask about attempts of other
        nodes' sessions (handed out by a node that died): those get no answer here."""

    # --- connections -----------------------------------------------------------------

    def connect(
        self,
        hello: Hello,
        ws: Wire,
        close: Callable[[int, str], Awaitable[None]],
        lease_valid: Callable[[], bool],
    ) -> Link | None:
        """Register a Worker connection from its ``hello`` (its agents registered already)
        and queue its ``welcome``; None if the Worker id is connected already and the hello
        did not prove it is the same process."""
        dispatcher = self.dispatcher

        async def send(frame: bytes, _batch: list[ServerMessage]) -> None:
            dispatcher.bytes_sent += len(frame)
            await ws.send(frame)

        outbox: Outbox[ServerMessage] = Outbox(send)
        queues = set()
        for agent in hello.agents:
            queues.add(f"model:{agent.name}")
            queues.update(f"tool:{agent.name}/{tool.name}" for tool in agent.tools)
        worker = WorkerConn(
            id=hello.worker_id,
            queues=queues,
            capacity=hello.capacity,
            send=outbox.put,
            agents=[a.name for a in hello.agents],
            history_cache=hello.history_cache,
        )
        try:
            stop, unreceived = self.dispatcher.connect(worker, hello.attempts, hello.resume)
        except WorkerIdInUse:
            return None
        stop = [a for a in stop if self.recovered(_session_of(a))]  # others: claimed elsewhere

        def close_from_server(code: int, reason: str) -> None:
            outbox.closed = True
            self.supervisor.spawn(close(code, reason))

        worker.close = close_from_server
        for held in unreceived:
            self.supervisor.spawn(self.hand_back_unreceived(held))
        outbox.put(
            Welcome(
                worker_id=worker.id,
                heartbeat_timeout=self.dispatcher.heartbeat_timeout,
                reconnect_grace=self.dispatcher.reconnect_grace,
                resume=worker.resume,
                stop=stop,
                members=self.members(),
            )
        )
        writer = asyncio.create_task(outbox.run())
        return Link(self, worker, outbox, lease_valid, writer, len(stop), len(unreceived))

    def announce_members(self, members: list[str]) -> None:
        """The cluster's nodes changed: tell every connected Worker (a ``members`` frame),
        so it connects to the nodes that joined and lets go of those that left."""
        message = Members(members=list(members))
        for worker in list(self.dispatcher.workers.values()):
            worker.send(message)

    def heartbeat(
        self, worker: WorkerConn, attempts: list[str]
    ) -> dict[str, Literal["ok", "stop"]]:
        """Extend each attempt this connection holds ("ok"); "stop" for the others (one
        another connection holds is refused, and never extended), but those of sessions
        this node has not recovered (``recovered``), which are left out."""
        status: dict[str, Literal["ok", "stop"]] = {}
        for a in attempts:
            if self.dispatcher.heartbeat(worker, a):
                status[a] = "ok"
            elif self.recovered(_session_of(a)):
                status[a] = "stop"
                if a in self.dispatcher.held:
                    self.dispatcher.refuse(worker, a, "hb")
        return status

    def claim(self, worker: WorkerConn, claims: dict[str, str]) -> dict[str, Literal["ok", "stop"]]:
        """A Worker's claims of attempts handed out by another node, each with the resume
        token it was handed out under (``Dispatcher.claim``): "ok" for those that are this
        connection's now, "stop" for those that run nowhere; those of sessions this node
        has not recovered, or not decided yet, are left out (the Worker asks again)."""
        status: dict[str, Literal["ok", "stop"]] = {}
        for a, resume in claims.items():
            if not self.recovered(_session_of(a)):
                continue
            verdict = self.dispatcher.claim(worker, a, resume)
            if verdict is not None:
                status[a] = "ok" if verdict else "stop"
        return status

    # --- hand-outs ---------------------------------------------------------------------

    async def assign(
        self, session_id: str, step_id: str, worker: WorkerConn
    ) -> server_frames.Step | None:
        """Record a hand-out of a queued Step to ``worker``; None if it is not queued any more."""

        def handle(s: SessionState, now: float) -> Transition:
            step = s.turn.step(step_id) if s.turn else None
            if step is None or step.status != StepStatus.QUEUED:
                raise _NotQueued
            handlers.assign(s, step_id, worker.id, now, worker.proof)
            return Transition()

        actor = await self.committer.actors.get(session_id)
        try:
            await self.committer.apply(actor, lambda _: handle, dispatch=False)
        except _NotQueued:
            return None
        step = actor.state.turn.step(step_id) if actor.state.turn else None
        assert step is not None
        return self.committer.handout(actor, step, worker)

    # --- results -----------------------------------------------------------------------

    def complete(self, attempt: str, payload: dict[str, Any] | bytes) -> asyncio.Future[Transition]:
        """Commit an attempt's result (a JSON object, parsed or as its text: a Worker's
        frame keeps it JSON, validated once by the type its Step expects). Raises at once
        for a result that cannot apply."""
        failpoints.hit("server.before_commit_result")
        if _too_deep(payload):
            raise InvalidInput(f"the result nests deeper than {MAX_JSON_DEPTH} levels")
        session_id, step_id, number = _parse(attempt)
        ended = _Ended("succeeded", None)

        def build(actor: Actor) -> Handle:
            spec = self.spec(actor.state.agent)
            step = ended.step = actor.state.turn.step(step_id) if actor.state.turn else None
            model, complete = _COMPLETE.get(step.type, _COMPLETE_TOOL) if step else _COMPLETE_TOOL
            if step is not None and step.type in _COMPLETE:  # a model call: priced
                ended.agent, ended.model = spec.name, model_name(spec.model)
            price = self.prices.of(ended.model) if ended.model is not None else None

            def handle(s: SessionState, now: float) -> Transition:
                result = _validated(model, payload)
                usage = getattr(result, "usage", None)
                if isinstance(usage, Usage):  # a model call: what it used, for its limits
                    tokens = usage.input_tokens + usage.output_tokens
                    self.dispatcher.limits.settle(session_id, step_id, tokens)
                if price is not None:
                    return complete(s, spec, step_id, number, result, now, price=price)
                return complete(s, spec, step_id, number, result, now)

            return handle

        return self._settling(session_id, build, attempt, ended)

    def fail(
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
            spec = self.spec(actor.state.agent)
            ended.step = actor.state.turn.step(step_id) if actor.state.turn else None
            return lambda s, now: handlers.fail_attempt(
                s, spec, step_id, number, failure, now, backoff=backoff
            )

        return self._settling(session_id, build, attempt, ended)

    def hand_back(
        self, attempt: str, rate_limited: bool = False, retry_after: float | None = None
    ) -> asyncio.Future[Transition]:
        """The Worker hands an unstarted attempt back (with ``rate_limited``, the model
        provider refused the call: it goes out again after ``retry_after`` or a backoff)."""
        session_id, step_id, number = _parse(attempt)
        ended = _Ended("rate_limited" if rate_limited else "handed_back", None)
        if rate_limited:
            self.dispatcher.limits.refused(session_id, step_id, retry_after)

        def build(actor: Actor) -> Handle:
            ended.step = actor.state.turn.step(step_id) if actor.state.turn else None
            if rate_limited:
                return lambda s, now: handlers.rate_limited(s, step_id, number, now, retry_after)
            return lambda s, now: handlers.hand_back(s, step_id, number)

        # The Step goes out again under this very attempt id: not in this commit, whose
        # hand-out would reach the Worker ahead of this hand-back's ack (the ack is sent
        # when the commit's future calls back), and a Worker ignores a hand-out of an
        # attempt it still holds. Offered, it goes out in a later commit, after the ack.
        return self._settling(session_id, build, attempt, ended, dispatch=False)

    def _settling(
        self,
        session_id: str,
        build: Callable[[Actor], Handle],
        attempt: str,
        ended: _Ended,
        dispatch: bool = True,
    ) -> asyncio.Future[Transition]:
        """Apply the end of ``attempt`` (let go once committed), and count it then."""
        done = self.committer.apply(session_id, build, release=attempt, dispatch=dispatch)
        done.add_done_callback(functools.partial(self._settled, ended))
        return done

    def _settled(self, ended: _Ended, done: asyncio.Future[Transition]) -> None:
        """After an attempt's end committed: count it."""
        if done.cancelled() or done.exception() is not None:
            return
        step_type = ended.step.type.value if ended.step is not None else "unknown"
        if ended.progress is None:
            self.metrics.attempt_ended(step_type, ended.outcome)
        else:
            self.metrics.attempt_ended(step_type, ended.outcome, ended.progress)
        step = ended.step
        if ended.model is not None and step is not None and step.usage is not None:
            self.metrics.model_used(ended.agent, ended.model, step.usage, step.cost_usd or 0.0)
        if ended.outcome == "succeeded":
            failpoints.hit("server.after_commit_result")

    # --- ends the node decides -----------------------------------------------------------

    async def expire(self, held: Held) -> None:
        """An attempt's Worker is gone (its connection closed and it did not come back
        within the reconnect grace) or silent (no heartbeat within the timeout). The
        attempt stays held until its failure is committed; it retries at once."""
        if held.refused:
            why = f"its result from Worker {held.worker_id} was refused: {held.refused}"
        elif held.proof is not None:
            why = (
                f"the node restarted or took the session over, and Worker {held.worker_id} "
                f"did not reclaim the attempt within {self.dispatcher.reclaim_window:g}s"
            )
        elif held.grace_until is not None and held.grace_until <= held.deadline:
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
            await self.supervisor.retrying(
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
            await self.supervisor.retrying(
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
    agent: str = ""
    model: str | None = None
    """For a model call: the model its agent names, for the usage metrics."""


class _NotQueued(Exception):
    """A hand-out found its Step no longer queued: nothing to record."""


def _acked(
    attempt: str, outbox: Outbox[ServerMessage], worker_id: str, done: asyncio.Future[Any]
) -> None:
    """Answer every result: committed (ok) or refused, never silence."""
    if done.cancelled():
        _answer(attempt, outbox, worker_id, asyncio.CancelledError())
    else:
        _answer(attempt, outbox, worker_id, done.exception())


def _answer(
    attempt: str, outbox: Outbox[ServerMessage], worker_id: str, error: BaseException | None
) -> None:
    if error is None:
        outbox.put(Ack(attempt_id=attempt, ok=True))
    elif isinstance(error, DexError | ValidationError):
        outbox.put(Ack(attempt_id=attempt, ok=False, error=str(error)))
    else:
        log.error(
            "committing a result failed",
            exc_info=error,
            extra={"action": "worker.result_failed", "attempt_id": attempt, "worker_id": worker_id},
        )
        outbox.put(
            Ack(
                attempt_id=attempt,
                ok=False,
                error=f"the server could not record this result: {type(error).__name__}",
            )
        )


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


def _session_of(attempt: str) -> str:
    """The session part of an attempt id, split as ``parse_attempt_id`` splits it, but
    without failing on a malformed one (a Worker's frames may carry any id): its session
    then holds no such attempt."""
    return attempt.rsplit("/", 2)[0]

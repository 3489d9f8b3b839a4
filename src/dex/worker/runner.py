"""The attempts a Worker holds, and how it runs them: models, summaries, tools.

An attempt is held from its hand-out (``step``) until the server settles it (an ``ack``
of its result, a ``stop`` or a ``cancel``). Its result is kept, encoded, until then, and
sent again after a reconnect (``dex.worker.connection``). A single-attempt tool starts
only on a timely ``ok`` to a heartbeat that asked for it.

In a cluster a Worker holds a connection to each node (``dex.worker.cluster``), and
every message about an attempt goes on the connection that handed it out (its
``origin``). When that node dies or gives the session up, the attempt runs on as a
stray, claimed on every connection (``claim``) until the node that took its session
over answers: it is that connection's from then on, or it stops. The connections share
one capacity: a Step that comes while the Worker runs as many attempts as its capacity
is handed back at once (``back``), and the node gives it to another Worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import orjson
from pydantic_core import to_jsonable_python

from dex import _failpoints as failpoints
from dex.agent import Agent
from dex.errors import ToolError
from dex.models.base import ModelRequest, RateLimited
from dex.tools import PENDING, Interrupt, ToolContext
from dex.wire import ITEMS, AttemptProgress, Item, ModelResponse, StepType, ToolOutcome
from dex.wire import server_frames as frames
from dex.wire.worker_frames import (
    Back,
    Delta,
    Done,
    Fail,
    Heartbeat,
    RecoveryError,
    WorkerMessage,
)
from dex.worker.history import HistoryCache

if TYPE_CHECKING:
    from dex.worker.tracing import AttemptTracing

log = logging.getLogger("dex.worker")
_NO_SPAN = contextlib.nullcontext()

Result = Done | Fail | Back


class Origin(Protocol):
    """The connection an attempt was handed out on: its heartbeats, text and result go
    back on it, and only its node's messages about the attempt count."""

    address: str
    histories: HistoryCache
    """The history views of the hand-outs on this connection (a node's ``history_base``
    counts on what it sent itself)."""
    resume: str | None
    """The resume token of its welcome: what a ``claim`` of an attempt it handed out
    proves itself with."""

    def send(self, message: WorkerMessage) -> None: ...


@dataclass(eq=False)
class Attempt:
    handout: frames.Step
    origin: Origin
    traceparent: str | None = None
    """The attempt's span on the server, when the server traces."""
    history: list[Item] = field(default_factory=list)
    """RunModel and CompactContext: the model's view, validated."""
    task: asyncio.Task[None] | None = None
    started: asyncio.Future[bool] | None = None
    start_seq: int | None = None
    """The ``seq`` of the heartbeat that asks to start it; only its timely answer counts."""
    start_sent: float = 0.0
    result: Result | None = None
    """Kept until the server acknowledges it."""
    resume: str | None = None
    """The resume token it was handed out under (its origin's then)."""
    stray: bool = False
    """Its origin may not run it any more: the connection dropped, or its node's
    heartbeat reply left it out (in a cluster, the node that handed it out died or
    gave its session up). Claimed on every connection (``strays``) until a node answers."""


class Runner:
    """Runs the attempts handed to one Worker, at most ``capacity`` at once over all its
    connections, and answers the servers' messages about them."""

    def __init__(
        self,
        worker_id: str,
        agents: Mapping[str, Agent],
        capacity: int,
        tracing: AttemptTracing | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.agents = agents
        self.capacity = capacity
        self.tracing = tracing
        self.attempts: dict[str, Attempt] = {}
        self.running: set[str] = set()
        """The attempts whose code runs (or waits for its start acknowledgement)."""
        self.handed_back = 0
        """Steps handed back at once because the capacity was taken (by other nodes')."""
        self.none_held = asyncio.Event()
        """Set while this Worker holds no attempt: a drain waits on it for the last acks."""
        self.none_held.set()
        self.start_window = 5.0
        """How soon a start acknowledgement must answer (half the heartbeat timeout)."""
        self.draining = False
        self._seq = itertools.count(1)
        self._beats: dict[Origin, tuple[int, list[str]]] = {}
        """Per connection, its last beat of all it holds (``beat``): its ``seq`` and what
        it named."""

    # --- the server's messages -------------------------------------------------------------

    def held_by(self, origin: Origin) -> list[str]:
        """The attempts handed out on ``origin`` that this Worker holds."""
        return [a for a, held in self.attempts.items() if held.origin is origin]

    def beat(self, origin: Origin) -> Heartbeat | None:
        """The heartbeat of every attempt ``origin`` holds (None if it holds none), with a
        ``seq`` of its own: an attempt it names that the reply leaves out is a stray."""
        held = self.held_by(origin)
        if not held:
            return None
        seq = next(self._seq)
        self._beats[origin] = (seq, held)
        return Heartbeat(held, seq=seq)

    def lost(self, origin: Origin) -> None:
        """``origin``'s connection dropped: its attempts are strays until its node, back,
        or the node that took their sessions over, answers for them."""
        self._beats.pop(origin, None)
        for held in self.attempts.values():
            if held.origin is origin:
                held.stray = True

    def strays(self) -> dict[str, str]:
        """What to ``claim``: each stray attempt, with the token it was handed out under."""
        return {
            a: held.resume
            for a, held in self.attempts.items()
            if held.stray and held.resume is not None
        }

    def _mine(self, attempt_id: str, origin: Origin) -> Attempt | None:
        held = self.attempts.get(attempt_id)
        return held if held is not None and held.origin is origin else None

    def on_message(self, message: frames.ServerMessage, origin: Origin) -> None:
        """A message about attempts from ``origin``'s node (a ``welcome`` is the
        connection's: ``welcomed``); about an attempt another node handed out, it does
        nothing."""
        if isinstance(message, frames.Ack):
            if self._mine(message.attempt_id, origin) is None:
                return
            acked = self.forget(message.attempt_id)
            if acked is not None and not message.ok:
                log.info(
                    "result refused: %s",
                    message.error,
                    extra={"action": "worker.result_refused", "attempt_id": message.attempt_id},
                )
        elif isinstance(message, frames.Step):
            self._on_step(message, origin)
        elif isinstance(message, frames.HeartbeatReply):
            self._on_reply(message, origin)
        elif isinstance(message, frames.Cancel):
            cancelled = self._mine(message.attempt_id, origin)
            if cancelled is not None and cancelled.result is None:
                self._abandon(cancelled, "cancelled by the server")
        elif isinstance(message, frames.Claimed):
            self._on_claimed(message, origin)

    def _taken(self, held: Attempt, origin: Origin) -> None:
        """A stray is ``origin``'s: the result it kept while no node ran it goes there."""
        held.origin = origin
        held.stray = False
        if held.result is not None:
            origin.send(held.result)

    def _on_claimed(self, claimed: frames.Claimed, origin: Origin) -> None:
        """``origin``'s node took over the sessions of strays it answers for: each is
        ``origin``'s from now on (its result, if any, goes there), or runs nowhere."""
        for attempt_id, status in claimed.status.items():
            held = self.attempts.get(attempt_id)
            if held is None or not held.stray:
                continue
            if status == "ok":
                self._taken(held, origin)
            elif held.result is None:
                self._abandon(held, "the server no longer runs this attempt")
            else:
                self.forget(attempt_id)

    def welcomed(self, welcome: frames.Welcome, origin: Origin) -> None:
        self.start_window = min(5.0, (welcome.heartbeat_timeout or float("inf")) / 2)
        for attempt_id in welcome.stop:
            stopped = self._mine(attempt_id, origin)
            if stopped is not None:
                self._abandon(stopped, "the server no longer runs this attempt")

    def _on_reply(self, reply: frames.HeartbeatReply, origin: Origin) -> None:
        seq = reply.seq
        beat = self._beats.get(origin)
        if beat is not None and seq == beat[0]:  # the beat of all it held: one left out
            for attempt_id in beat[1]:  # is a stray (its node gave its session up)
                held = self._mine(attempt_id, origin)
                if held is not None and attempt_id not in reply.status:
                    held.stray = True
        for attempt_id, status in reply.status.items():
            held = self._mine(attempt_id, origin)
            if held is None:
                continue
            if status == "ok" and held.stray:
                self._taken(held, origin)
            if held.started is not None and not held.started.done():
                if status != "ok":
                    held.started.set_result(False)
                elif (
                    seq is not None
                    and seq == held.start_seq
                    and time.monotonic() - held.start_sent <= self.start_window
                ):
                    held.started.set_result(True)  # a timely answer to our own ask
            elif status != "ok" and held.result is None:
                self._abandon(held, "the server no longer runs this attempt")

    def _on_step(self, handout: frames.Step, origin: Origin) -> None:
        if handout.attempt_id in self.attempts:
            return
        raw = handout.history
        handout.history = msgspec.UNSET  # the frame's buffer is not kept with the attempt
        attempt = Attempt(handout, origin, handout.traceparent, resume=origin.resume)
        self.attempts[handout.attempt_id] = attempt
        self.none_held.clear()
        if raw is msgspec.UNSET:
            pass
        elif handout.step_type == StepType.RUN_MODEL:
            view = origin.histories.view(handout.session_id, handout.history_base, raw)
            if view is None:  # we lack what it builds on: the server sends it whole
                attempt.result = Back(handout.attempt_id, reason="history")
                origin.send(attempt.result)
                return
            attempt.history = view
        else:  # CompactContext: the whole view, every time
            attempt.history = ITEMS.validate_json(bytes(raw))
        if len(self.running) >= self.capacity:
            # other nodes' Steps take the capacity (each node counts only its own): this
            # one goes back at once, to another Worker (its history view is kept, as the
            # node assumes)
            self.handed_back += 1
            log.debug(
                "capacity taken: handing back %s to %s",
                handout.attempt_id,
                origin.address,
                extra={
                    "action": "worker.handed_back",
                    "attempt_id": handout.attempt_id,
                    "address": origin.address,
                },
            )
            attempt.result = Back(handout.attempt_id)
            origin.send(attempt.result)
            return
        self.running.add(handout.attempt_id)
        attempt.task = asyncio.create_task(self._run(attempt))
        attempt.task.add_done_callback(lambda _: self.running.discard(handout.attempt_id))

    def forget(self, attempt_id: str) -> Attempt | None:
        attempt = self.attempts.pop(attempt_id, None)
        if not self.attempts:
            self.none_held.set()
        return attempt

    def _abandon(self, attempt: Attempt, why: str) -> None:
        log.info(
            why,
            extra={"action": "worker.attempt_abandoned", "attempt_id": attempt.handout.attempt_id},
        )
        self.forget(attempt.handout.attempt_id)
        if attempt.task is not None:
            attempt.task.cancel()

    async def finish(self, timeout: float) -> None:
        """Draining: hand back what waits to start, let the rest run up to ``timeout``,
        then cancel what is still running."""
        self.draining = True
        for attempt in list(self.attempts.values()):
            if attempt.started is not None and not attempt.started.done():
                attempt.started.set_result(False)  # hands it back
        tasks = [a.task for a in self.attempts.values() if a.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()

    # --- running one attempt ---------------------------------------------------------------

    async def _run(self, attempt: Attempt) -> None:
        h = attempt.handout
        try:
            agent = self.agents.get(h.agent)
            if agent is None:
                raise ToolError(f"this Worker does not serve agent {h.agent!r}")
            with self._span(attempt, agent):
                if h.step_type == StepType.RUN_MODEL:
                    result = await self._run_model(agent, attempt)
                elif h.step_type == StepType.COMPACT_CONTEXT:
                    result = await self._compact(agent, h, attempt.history)
                else:
                    result = await self.run_tool(agent, attempt)
            if result is None:
                return
            failpoints.hit("worker.before_send_result")
            attempt.result = _done(h, result)
        except asyncio.CancelledError:
            raise
        except Interrupt as pause:  # ctx.ask or ctx.sleep: the call goes on later
            attempt.result = _done(h, pause.outcome.model_dump(mode="json"))
        except ToolError as e:
            if h.step_type in _MODEL_STEPS:
                attempt.result = _fail(h, str(e), retryable=False)
            else:
                outcome = (
                    ToolOutcome(status="checked", happened=None, error=e.message)
                    if h.step_type == StepType.CHECK_TOOL_CALL
                    else ToolOutcome(status="failed", error=e.message)
                )
                attempt.result = _done(h, outcome.model_dump(mode="json"))
        except Exception as e:
            if isinstance(e, RateLimited) and h.step_type in _MODEL_STEPS:
                # the provider refused the call, and nothing ran: the Step goes back, and
                # is handed out again after the wait (no attempt used)
                log.info(
                    "%s",
                    e.message,
                    extra={"action": "worker.rate_limited", "attempt_id": h.attempt_id},
                )
                attempt.result = Back(
                    h.attempt_id, reason="rate_limited", retry_after=e.retry_after
                )
            else:
                attempt.result = self._failed(h, e)
        if attempt.result is not None and not attempt.stray:  # a stray's waits (``_taken``)
            attempt.origin.send(attempt.result)

    def _failed(self, h: frames.Step, e: Exception) -> Fail:
        """The failure of an attempt whose code raised ``e`` (logged)."""
        log.warning(
            "%s attempt %d of %s failed: %s: %s",
            h.step_type.value,
            h.attempt,
            h.tool or h.agent,
            type(e).__name__,
            e,
            exc_info=True,
            extra={
                "action": "worker.attempt_failed",
                "session_id": h.session_id,
                "step_id": h.step_id,
                "attempt_id": h.attempt_id,
                "agent": h.agent,
                "tool": h.tool,
                "call_id": h.call_id,
                "worker_id": self.worker_id,
            },
        )
        return _fail(h, f"{type(e).__name__}: {e}", retryable=getattr(e, "retryable", True))

    def _span(self, attempt: Attempt, agent: Agent) -> AbstractContextManager[None]:
        if self.tracing is None:
            return _NO_SPAN
        return self.tracing.span(attempt.handout, attempt.traceparent, agent.model.spec())

    async def _run_model(self, agent: Agent, attempt: Attempt) -> dict[str, Any] | None:
        h, history = attempt.handout, attempt.history
        request = ModelRequest(
            session_id=h.session_id,
            agent=agent.name,
            instructions=agent.instructions,
            history=history,
            tools=[t.spec() for t in agent.all_tools()],
            attempt=h.attempt,
        )
        response: ModelResponse | None = None
        failpoints.hit("worker.run_model.before_output")
        async for event in agent.model.stream(request):
            if isinstance(event, ModelResponse):
                response = event
            else:
                attempt.origin.send(Delta(h.attempt_id, event))  # its origin may change
        if response is None:
            raise RuntimeError(f"model {agent.model.spec()} returned no response")
        for call in response.tool_calls:
            tool = agent.tool(call.name)
            if tool is not None and callable(tool.approval) and tool.needs_approval(call.arguments):
                response.approval_required.append(call.id)
        return response.model_dump(mode="json")

    async def _compact(self, agent: Agent, h: frames.Step, history: list[Item]) -> dict[str, Any]:
        request = ModelRequest(
            session_id=h.session_id,
            agent=agent.name,
            instructions=agent.instructions,
            history=history,
            tools=[],
            attempt=h.attempt,
        )
        failpoints.hit("worker.compact_context.running")
        summary = await agent.model.summarize(request)
        return summary.model_dump(mode="json")

    async def run_tool(self, agent: Agent, attempt: Attempt) -> dict[str, Any] | None:
        """A tool Step's outcome; None if it never started (its result is sent or none
        is wanted). A single-attempt tool's body starts only on the server's ``ok``."""
        h = attempt.handout
        assert h.tool is not None and h.call_id is not None and h.idempotency_key is not None
        tool = agent.tool(h.tool)
        if tool is None:
            raise ToolError(f"this Worker's agent {agent.name!r} has no tool {h.tool!r}")
        arguments = tool.validate(h.arguments)  # invalid arguments: the body never runs
        failpoints.hit("worker.before_first_heartbeat")
        if h.needs_start_ack or self.draining:
            attempt.started = asyncio.get_running_loop().create_future()
            if self.draining:
                attempt.started.set_result(False)
            if not await self.start_acknowledged(attempt):
                if self.draining:
                    attempt.result = Back(h.attempt_id)
                    if not attempt.stray:  # a stray's waits (``_taken``)
                        attempt.origin.send(attempt.result)
                else:
                    log.info(
                        "the server no longer runs this attempt: not starting it",
                        extra={"action": "worker.start_refused", "attempt_id": h.attempt_id},
                    )
                    self.forget(h.attempt_id)
                return None
        ctx = ToolContext(
            session_id=h.session_id,
            call_id=h.call_id,
            tool=tool.name,
            idempotency_key=h.idempotency_key,
            attempt=h.attempt,
            _heartbeat=lambda: self._beat(attempt),
            answers=list(h.answers),
            sleeps_done=h.sleeps_done,
        )
        if h.step_type == StepType.POLL_TOOL_TASK:
            failpoints.hit("worker.poll_running")
            value = await tool.call_poll(ctx, h.task_handle)
            if value is PENDING:
                return dict(_PENDING)
        elif h.step_type == StepType.CHECK_TOOL_CALL:
            verdict = await tool.call_check(ctx, arguments)
            outcome = ToolOutcome(
                status="checked", happened=verdict.happened, result=verdict.result
            )
            return outcome.model_dump(mode="json")
        else:
            failpoints.hit("worker.tool_running")
            value = await tool.invoke(ctx, arguments)
        return succeeded(value)

    async def start_acknowledged(self, attempt: Attempt) -> bool:
        """Ask the node whether to start (a heartbeat with a ``seq`` of ours) until it
        answers in time: an ``ok`` that comes back later than ``start_window`` (a node
        that paused, and may have lost its lease meanwhile) does not count."""
        started = attempt.started
        assert started is not None
        while not started.done():
            attempt.start_seq = next(self._seq)
            attempt.start_sent = time.monotonic()
            if not attempt.stray:  # a stray asks its new origin, once a node claims it
                attempt.origin.send(Heartbeat([attempt.handout.attempt_id], seq=attempt.start_seq))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(started), self.start_window)
        return started.result()

    async def _beat(self, attempt: Attempt) -> None:
        attempt.origin.send(Heartbeat([attempt.handout.attempt_id]))


_MODEL_STEPS = (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT)
_SUCCEEDED = ToolOutcome(status="succeeded").model_dump(mode="json")
_PENDING = ToolOutcome(status="pending").model_dump(mode="json")


def succeeded(value: Any) -> dict[str, Any]:
    """``ToolOutcome(status="succeeded", result=value).model_dump(mode="json")``, without
    building and dumping a model: the outcome of nearly every tool call, and a tenth of
    the cost. ``value`` goes through the same serializer that dump uses for ``Any``
    (a value it cannot serialize raises the same error, and the attempt fails)."""
    return {**_SUCCEEDED, "result": to_jsonable_python(value, by_alias=False, inf_nan_mode="null")}


def _done(h: frames.Step, result: dict[str, Any]) -> Done | Fail:
    """The ``done`` of ``result``, encoded now; a result JSON cannot carry (an integer
    beyond 64 bits) becomes the attempt's failure: its code ran, so the server decides, as
    for any exception, whether the call is retried or its outcome is unknown."""
    try:
        return Done(h.attempt_id, msgspec.Raw(orjson.dumps(result)))
    except orjson.JSONEncodeError as e:
        problem = f"the result cannot be sent as JSON: {e}"
    log.warning(
        "%s", problem, extra={"action": "worker.result_unencodable", "attempt_id": h.attempt_id}
    )
    return _fail(h, problem, retryable=True)


def _fail(h: frames.Step, message: str, *, retryable: bool) -> Fail:
    error = RecoveryError(message, AttemptProgress.NOT_COMPLETED, retryable)
    return Fail(h.attempt_id, error)

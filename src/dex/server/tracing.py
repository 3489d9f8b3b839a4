"""OpenTelemetry spans of turns, Steps and attempts, derived from the durable state.

Loaded only when tracing is on (``ServerConfig.tracing``, ``dex server --tracing``): with
it off the domain holds ``None`` instead of a ``Tracing`` and calls nothing here.

The spans a user sees::

    dex.turn                      one per turn, from the user message to its end
      RunModel                    one per Step (waits too: AwaitToolApproval, ...)
        attempt                   one per hand-out of the Step to a Worker
          dex.model concierge     the Worker's span (``dex.worker.tracing``), and the
            ...                   spans of the user's code under it
      CallTool get_weather
        attempt
          dex.tool get_weather

Every span's times are the state's own (``created_at``, ``started_at``, ``ended_at``), so
a span made on another node than the one that started its Step still shows when it
really began. The domain calls ``before_commit`` (a new turn gets its span, and the
span's W3C ``traceparent`` is stored in the turn) and ``after_commit`` (Steps and attempts
that appeared get spans, those that ended are ended). An attempt's hand-out carries its
span's ``traceparent``, so the Worker's spans nest under it.

Across a restart or a takeover: spans live in the memory of the node that made them, so
a node that dies takes its open spans with it (the ones that had ended were exported).
The node that recovers a running turn starts a new ``dex.turn`` span (attribute
``dex.turn.resumed``) in the same trace, as a child of the stored ``traceparent`` and with
a link to it, and ends it when the turn ends; Steps and attempts still open get spans on
the new node, with their real start times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import dex
from dex.server.engine.state import Attempt, SessionState, Step, Turn, TurnStatus, attempt_id
from dex.wire import AttemptOutcome, StepStatus

_PROPAGATOR = TraceContextTextMapPropagator()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def traceparent(span: Span) -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier["traceparent"]


@dataclass(eq=False)
class _OpenTurn:
    number: int
    span: Span
    since: float
    """Steps and attempts that ended before this are another node's (or ended before
    this node knew the turn): they get no span here."""
    steps: dict[str, Span] = field(default_factory=dict)
    attempts: dict[str, Span] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    """Step and attempt ids whose spans have ended (or that get none here)."""


class Tracing:
    """The open spans of this node's running turns."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        provider = provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("dex.server", dex.__version__)
        self.started_at = 0.0
        """When this node began to lead (on the state's clock), set by ``Sessions.start``:
        a recovered turn's Steps and attempts that ended before are the old node's."""
        self._turns: dict[str, _OpenTurn] = {}

    def before_commit(self, state: SessionState) -> None:
        """A turn that has no span yet gets one now, and keeps its ``traceparent`` in the
        state this commit writes."""
        turn = state.turn
        if turn is None or turn.trace is not None:
            return
        # a trace of its own (a turn may start in another turn's commit); linked to the
        # request that started it, if that request is traced
        request = trace.get_current_span().get_span_context()
        span = self.tracer.start_span(
            "dex.turn",
            context=Context(),
            kind=SpanKind.SERVER,
            start_time=_ns(turn.started_at),
            links=[Link(request, {"dex.link": "the request"})] if request.is_valid else None,
            attributes=_turn_attributes(state, turn),
        )
        turn.trace = traceparent(span)
        self._turns[state.id] = _OpenTurn(turn.number, span, since=turn.started_at)

    def after_commit(self, state: SessionState, ended: Turn | None) -> None:
        if ended is not None:
            self._observe(state, ended)
        if state.turn is not None:
            self._observe(state, state.turn)

    def traceparent(self, session_id: str, aid: str) -> str | None:
        """The ``traceparent`` of an attempt's span, for its hand-out."""
        open_turn = self._turns.get(session_id)
        span = open_turn.attempts.get(aid) if open_turn is not None else None
        return traceparent(span) if span is not None else None

    def _observe(self, state: SessionState, turn: Turn) -> None:
        open_turn = self._turns.get(state.id)
        if open_turn is None or open_turn.number != turn.number:
            open_turn = self._resume(state, turn)
        for step in turn.steps:
            if step.id not in open_turn.done:
                self._step(state, turn, open_turn, step)
        if turn.status != TurnStatus.RUNNING:
            span = open_turn.span
            span.set_attribute("dex.turn.status", turn.status.value)
            if turn.status == TurnStatus.FAILED:
                span.set_status(Status(StatusCode.ERROR, turn.error or "the turn failed"))
            for left in [*open_turn.attempts.values(), *open_turn.steps.values()]:
                left.end(end_time=_ns(turn.ended_at) if turn.ended_at is not None else None)
            _end(span, turn.ended_at)
            del self._turns[state.id]

    def _resume(self, state: SessionState, turn: Turn) -> _OpenTurn:
        """A turn this node did not start (it recovered it after a restart or takeover)."""
        links: list[Link] = []
        parent = None
        if turn.trace is not None:
            parent = _PROPAGATOR.extract({"traceparent": turn.trace})
            context = trace.get_current_span(parent).get_span_context()
            if context.is_valid:
                links.append(Link(context, {"dex.link": "the turn's span on an earlier node"}))
        span = self.tracer.start_span(
            "dex.turn",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=_ns(turn.started_at),
            links=links,
            attributes={**_turn_attributes(state, turn), "dex.turn.resumed": True},
        )
        open_turn = _OpenTurn(turn.number, span, since=self.started_at)
        self._turns[state.id] = open_turn
        return open_turn

    def _step(self, state: SessionState, turn: Turn, open_turn: _OpenTurn, step: Step) -> None:
        span = open_turn.steps.get(step.id)
        if span is None:
            if step.ended_at is not None and step.ended_at < open_turn.since:
                open_turn.done.add(step.id)
                return
            attributes: dict[str, Any] = {
                "dex.session_id": state.id,
                "dex.turn": turn.number,
                "dex.step_id": step.id,
                "dex.step_type": step.type.value,
            }
            name = step.type.value
            call = turn.tool_call(step.tool_call_id) if step.tool_call_id else None
            if call is not None:
                name = f"{name} {call.name}"
                attributes.update({"dex.tool": call.name, "dex.call_id": call.id})
            span = self.tracer.start_span(
                name,
                context=trace.set_span_in_context(open_turn.span),
                start_time=_ns(step.created_at),
                attributes=attributes,
            )
            open_turn.steps[step.id] = span
        current = set()
        for attempt in step.attempts:
            aid = attempt_id(state.id, step.id, attempt.number)
            current.add(aid)
            if aid not in open_turn.done:
                self._attempt(open_turn, span, aid, attempt)
        prefix = attempt_id(state.id, step.id, 0)[:-1]
        for aid in [a for a in open_turn.attempts if a.startswith(prefix) and a not in current]:
            # handed back unstarted: no attempt used (the id may be handed out again)
            back = open_turn.attempts.pop(aid)
            back.set_attribute("dex.outcome", "handed_back")
            back.end()
        if step.status not in (StepStatus.QUEUED, StepStatus.RUNNING, StepStatus.WAITING):
            span.set_attribute("dex.step_status", step.status.value)
            if step.status == StepStatus.FAILED:
                message = step.error.message if step.error else "the Step failed"
                span.set_status(Status(StatusCode.ERROR, message))
            _end(span, step.ended_at)
            del open_turn.steps[step.id]
            open_turn.done.add(step.id)

    def _attempt(self, open_turn: _OpenTurn, parent: Span, aid: str, attempt: Attempt) -> None:
        span = open_turn.attempts.get(aid)
        if span is None:
            if attempt.ended_at is not None and attempt.ended_at < open_turn.since:
                open_turn.done.add(aid)
                return
            span = self.tracer.start_span(
                "attempt",
                context=trace.set_span_in_context(parent),
                kind=SpanKind.PRODUCER,
                start_time=_ns(attempt.started_at),
                attributes={
                    "dex.attempt_id": aid,
                    "dex.attempt": attempt.number,
                    "dex.worker_id": attempt.worker_id,
                },
            )
            open_turn.attempts[aid] = span
        if attempt.outcome == AttemptOutcome.RUNNING:
            return
        span.set_attribute("dex.outcome", attempt.outcome.value)
        if attempt.error is not None:
            span.set_attribute("dex.attempt_progress", attempt.error.attempt_progress.value)
            if attempt.outcome == AttemptOutcome.FAILED:
                span.set_status(Status(StatusCode.ERROR, attempt.error.message))
        _end(span, attempt.ended_at)
        del open_turn.attempts[aid]
        open_turn.done.add(aid)


def _turn_attributes(state: SessionState, turn: Turn) -> dict[str, Any]:
    return {"dex.session_id": state.id, "dex.agent": state.agent, "dex.turn": turn.number}


def _end(span: Span, at: float | None) -> None:
    span.end(end_time=_ns(at) if at is not None else None)

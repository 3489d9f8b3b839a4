"""Pure turn handlers: (session state, input) -> transition.

Each handler first checks that the input applies (raising ``NotFound`` or
``Conflict`` without touching the state), then mutates the state it was given
and returns a ``Transition`` that lists what else must be written (history
items, an ended turn) and what must happen once the commit is durable (Steps to
dispatch, attempts to cancel, turn waiters to wake). The caller owns the state:
if its commit fails it throws this state away and reloads it from storage.

No I/O, no clock: ``now`` is an argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dex.errors import Conflict, NotFound
from dex.server.engine.state import (
    Attempt,
    QueuedMessage,
    SessionState,
    SessionStatus,
    Step,
    ToolCall,
    Turn,
    TurnStatus,
    attempt_id,
)
from dex.wire import (
    SINGLE_ATTEMPT,
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AgentSpec,
    AssistantItem,
    AttemptOutcome,
    AttemptProgress,
    Item,
    ModelResponse,
    NoteItem,
    RecoveryError,
    StepStatus,
    StepType,
    ToolCallStatus,
    ToolKind,
    ToolOutcome,
    ToolResultItem,
    UserItem,
)


@dataclass
class Transition:
    history: list[Item] = field(default_factory=list)
    ready: list[Step] = field(default_factory=list)
    """Steps that became queued and may be handed to a Worker."""
    ended_turn: Turn | None = None
    cancel: list[str] = field(default_factory=list)
    """Attempt ids whose Worker should stop."""
    events: list[dict[str, Any]] = field(default_factory=list)


def model_queue(agent: str) -> str:
    return f"model:{agent}"


def tool_queue(agent: str, tool: str) -> str:
    return f"tool:{agent}/{tool}"


# --- inputs from clients -------------------------------------------------------


def receive_message(
    state: SessionState, spec: AgentSpec, text: str, message_id: str | None, now: float
) -> tuple[Transition, int]:
    """A user message: starts a turn, or waits for the running one to end."""
    t = Transition()
    state.messages_received += 1
    number = state.messages_received
    message = QueuedMessage(number=number, text=text, message_id=message_id)
    if state.status == SessionStatus.IDLE:
        _start_turn(state, spec, message, now, t)
    else:
        state.queued.append(message)
        t.events.append({"type": "message.queued", "turn": number})
    return t, number


# --- inputs from the dispatcher and Workers -------------------------------------


def assign(state: SessionState, step_id: str, worker_id: str, now: float) -> Attempt:
    """Hand a queued Step to a Worker: its next attempt starts."""
    step = _step(state, step_id)
    if step.status != StepStatus.QUEUED:
        raise Conflict(f"step {step_id} is {step.status}, not queued")
    attempt = Attempt(number=len(step.attempts) + 1, worker_id=worker_id, started_at=now)
    step.attempts.append(attempt)
    step.status = StepStatus.RUNNING
    step.not_before = None
    call = _call_of(state, step)
    if call is not None:
        call.status = ToolCallStatus.RUNNING
    return attempt


def complete_model(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    response: ModelResponse,
    now: float,
) -> Transition:
    step = _running(state, step_id, number, StepType.RUN_MODEL)
    turn = _turn(state)
    t = Transition()
    _end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.usage = response.usage.model_dump()
    assistant = AssistantItem(text=response.text, tool_calls=response.tool_calls)
    t.history.append(assistant)
    if not response.tool_calls:
        _end_turn(state, spec, TurnStatus.COMPLETED, now, t, text=response.text)
        return t
    turn.batch = []
    for model_call in response.tool_calls:
        call_id = f"{turn.number}.{len(turn.tool_calls) + 1}"
        tool = spec.tool(model_call.name)
        call = ToolCall(
            id=call_id,
            model_call_id=model_call.id,
            name=model_call.name,
            arguments=model_call.arguments,
            kind=tool.kind if tool else None,
            idempotency_key=f"{state.id}/{call_id}",
        )
        turn.tool_calls.append(call)
        turn.batch.append(call.id)
        if tool is None:
            known = ", ".join(sorted(s.name for s in spec.tools)) or "none"
            call.status = ToolCallStatus.FAILED
            call.error = f"unknown tool {model_call.name!r}; the tools are: {known}"
            continue
        single = tool.kind == ToolKind.WRITE
        tool_step = _new_step(
            turn,
            StepType.CALL_SINGLE_ATTEMPT_TOOL if single else StepType.CALL_TOOL,
            tool_queue(spec.name, tool.name),
            SINGLE_ATTEMPT if single else tool.retry,
            now,
        )
        tool_step.tool_call_id = call.id
        call.step_id = tool_step.id
        t.ready.append(tool_step)
    _after_tool_call(state, spec, now, t)
    return t


def complete_tool(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    outcome: ToolOutcome,
    now: float,
) -> Transition:
    step = _running(state, step_id, number, StepType.CALL_TOOL, StepType.CALL_SINGLE_ATTEMPT_TOOL)
    call = _call_of(state, step)
    assert call is not None
    t = Transition()
    _end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    if outcome.status == "succeeded":
        call.status = ToolCallStatus.SUCCEEDED
        call.result = outcome.result
    else:
        call.status = ToolCallStatus.FAILED
        call.error = outcome.error or "the tool failed"
    _after_tool_call(state, spec, now, t)
    return t


def fail_attempt(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    error: RecoveryError,
    now: float,
) -> Transition:
    """An attempt failed: retry the Step if its policy allows, else fail it for good."""
    step = _running(state, step_id, number)
    t = Transition()
    _end_attempt(step, AttemptOutcome.FAILED, now, error)
    used = len(step.attempts)
    first = step.attempts[0].started_at
    delay = step.retry.backoff(used)
    if (
        error.retryable
        and used < step.retry.max_attempts
        and now + delay < first + step.retry.within_seconds
    ):
        step.status = StepStatus.QUEUED
        step.not_before = now + delay if delay > 0 else None
        call = _call_of(state, step)
        if call is not None:
            call.status = ToolCallStatus.PENDING
        t.ready.append(step)
        return t
    _fail_step(state, spec, step, error, now, t)
    return t


def hand_back(state: SessionState, step_id: str, number: int) -> Transition:
    """A Worker returns an attempt it never started: the Step queues again, no attempt used."""
    step = _running(state, step_id, number)
    step.attempts.pop()
    step.handed_back += 1
    step.status = StepStatus.QUEUED
    call = _call_of(state, step)
    if call is not None:
        call.status = ToolCallStatus.PENDING
    return Transition(ready=[step])


def recover(state: SessionState, spec: AgentSpec, now: float, reason: str) -> Transition:
    """Fail every attempt that was handed out and not committed (a node starts or takes over)."""
    t = Transition()
    for step in state.running_steps():
        attempt = step.current
        if step.status != StepStatus.RUNNING or attempt is None:
            continue  # an earlier failure in this loop ended the turn
        error = RecoveryError(message=reason, attempt_progress=AttemptProgress.NOT_COMPLETED)
        sub = fail_attempt(state, spec, step.id, attempt.number, error, now)
        _merge(t, sub)
    return t


# --- the turn ---------------------------------------------------------------------


def _start_turn(
    state: SessionState, spec: AgentSpec, message: QueuedMessage, now: float, t: Transition
) -> None:
    turn = Turn(number=message.number, message_id=message.message_id, started_at=now)
    state.turn = turn
    state.status = SessionStatus.RUNNING
    t.history.append(UserItem(text=message.text))
    t.events.append({"type": "turn.started", "turn": turn.number})
    t.ready.append(
        _new_step(turn, StepType.RUN_MODEL, model_queue(spec.name), spec.model_retry, now)
    )


def _after_tool_call(state: SessionState, spec: AgentSpec, now: float, t: Transition) -> None:
    """When every call of the latest model response has a result, the model runs again."""
    turn = _turn(state)
    calls = [turn.tool_call(call_id) for call_id in turn.batch]
    if not all(c is not None and c.status.terminal for c in calls):
        return
    for call in calls:
        assert call is not None
        t.history.append(
            ToolResultItem(
                call_id=call.model_call_id,
                name=call.name,
                status=call.status,
                result=call.result,
                error=call.error,
            )
        )
    turn.batch = []
    t.ready.append(
        _new_step(turn, StepType.RUN_MODEL, model_queue(spec.name), spec.model_retry, now)
    )


def _fail_step(
    state: SessionState,
    spec: AgentSpec,
    step: Step,
    error: RecoveryError,
    now: float,
    t: Transition,
) -> None:
    step.status = StepStatus.FAILED
    step.ended_at = now
    progress = step.progress
    step.error = error.model_copy(update={"attempt_progress": progress})
    call = _call_of(state, step)
    if call is None:  # RunModel
        _end_turn(state, spec, TurnStatus.FAILED, now, t, error=f"RunModel failed: {error.message}")
        return
    if progress == AttemptProgress.NOT_STARTED:
        call.status = ToolCallStatus.FAILED
        call.error = f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: {error.message}"
    elif call.kind == ToolKind.READ:
        call.status = ToolCallStatus.FAILED
        call.error = error.message
    else:
        call.status = ToolCallStatus.OUTCOME_UNKNOWN
        call.error = (
            f"the outcome is unknown: the tool may have run ({error.message}); "
            "it will not run again"
        )
    _after_tool_call(state, spec, now, t)


def _end_turn(
    state: SessionState,
    spec: AgentSpec,
    status: TurnStatus,
    now: float,
    t: Transition,
    *,
    text: str | None = None,
    error: str | None = None,
) -> None:
    turn = _turn(state)
    turn.status = status
    turn.ended_at = now
    turn.text = text
    turn.error = error
    for step in turn.steps:
        if step.status in (StepStatus.QUEUED, StepStatus.RUNNING):
            if step.current is not None:
                t.cancel.append(attempt_id(state.id, step.id, step.current.number))
                _end_attempt(step, AttemptOutcome.CANCELLED, now)
            step.status = StepStatus.CANCELLED
            step.ended_at = now
    if status != TurnStatus.COMPLETED:
        ran = [c for c in turn.tool_calls if _ran(c)]
        if ran:
            t.history.append(NoteItem(text=_failed_turn_note(ran)))
    t.ended_turn = turn
    t.events.append({"type": f"turn.{status.value}", "turn": turn.number})
    state.turn = None
    state.status = SessionStatus.IDLE
    if state.queued:
        _start_turn(state, spec, state.queued.pop(0), now, t)


def _ran(call: ToolCall) -> bool:
    """Whether the call's tool may have run: it had a Step, and that Step reached a Worker."""
    if call.step_id is None:  # an unknown tool: no Step, nothing ran
        return False
    if call.status in (ToolCallStatus.SUCCEEDED, ToolCallStatus.OUTCOME_UNKNOWN):
        return True
    return call.status == ToolCallStatus.FAILED and not (call.error or "").startswith(
        TOOL_CALL_NOT_RUN_ERROR_PREFIX
    )


def _failed_turn_note(calls: list[ToolCall]) -> str:
    lines = [
        "The previous turn failed before the model could answer. These tool calls already"
        " ran; do not repeat them:"
    ]
    for call in calls:
        args = json.dumps(call.arguments, sort_keys=True)
        outcome = json.dumps(call.result) if call.status == ToolCallStatus.SUCCEEDED else call.error
        lines.append(f"- {call.name}({args}) -> {call.status.value}: {outcome}")
    return "\n".join(lines)


# --- helpers -------------------------------------------------------------------------


def _new_step(turn: Turn, type_: StepType, queue: str, retry: Any, now: float) -> Step:
    step = Step(
        id=f"{turn.number}.{len(turn.steps) + 1}",
        type=type_,
        queue=queue,
        retry=retry,
        created_at=now,
    )
    turn.steps.append(step)
    return step


def _turn(state: SessionState) -> Turn:
    if state.turn is None:
        raise Conflict(f"session {state.id} has no running turn")
    return state.turn


def _step(state: SessionState, step_id: str) -> Step:
    step = state.turn.step(step_id) if state.turn else None
    if step is None:
        raise NotFound(f"session {state.id} has no current step {step_id}")
    return step


def _running(state: SessionState, step_id: str, number: int, *types: StepType) -> Step:
    step = _step(state, step_id)
    current = step.current
    if current is None or current.number != number:
        raise Conflict(f"attempt {number} of step {step_id} is not running")
    if types and step.type not in types:
        raise Conflict(f"step {step_id} is a {step.type}, not a {'/'.join(types)}")
    return step


def _call_of(state: SessionState, step: Step) -> ToolCall | None:
    if step.tool_call_id is None or state.turn is None:
        return None
    return state.turn.tool_call(step.tool_call_id)


def _end_attempt(
    step: Step, outcome: AttemptOutcome, now: float, error: RecoveryError | None = None
) -> None:
    attempt = step.attempts[-1]
    attempt.outcome = outcome
    attempt.ended_at = now
    attempt.error = error


def _merge(into: Transition, other: Transition) -> None:
    into.history.extend(other.history)
    into.ready.extend(other.ready)
    into.cancel.extend(other.cancel)
    into.events.extend(other.events)
    if other.ended_turn is not None:
        into.ended_turn = other.ended_turn

"""Steps and their attempts: finding them in the current turn (raising ``NotFound`` or
``Conflict`` when the input does not apply), adding a Step, ending an attempt."""

from __future__ import annotations

from dex.errors import Conflict, NotFound
from dex.server.engine.state import (
    AttemptError,
    Retry,
    SessionState,
    Step,
    ToolCall,
    Turn,
    attempt_id,
)
from dex.server.engine.transition import Transition
from dex.wire import AttemptOutcome, StepType


def model_queue(agent: str) -> str:
    return f"model:{agent}"


def tool_queue(agent: str, tool: str) -> str:
    return f"tool:{agent}/{tool}"


def current_turn(state: SessionState) -> Turn:
    if state.turn is None:
        raise Conflict(f"session {state.id} has no running turn")
    return state.turn


def find_step(state: SessionState, step_id: str) -> Step:
    step = state.turn.step(step_id) if state.turn else None
    if step is None:
        raise NotFound(f"session {state.id} has no current step {step_id}")
    return step


def find_call(state: SessionState, call_id: str) -> ToolCall:
    call = state.turn.tool_call(call_id) if state.turn else None
    if call is None:
        raise NotFound(f"session {state.id} has no tool call {call_id} in its current turn")
    return call


def running_step(state: SessionState, step_id: str, number: int, *types: StepType) -> Step:
    step = find_step(state, step_id)
    current = step.current
    if current is None or current.number != number:
        raise Conflict(f"attempt {number} of step {step_id} is not running")
    if types and step.type not in types:
        raise Conflict(f"step {step_id} is a {step.type}, not a {'/'.join(types)}")
    return step


def call_of(state: SessionState, step: Step) -> ToolCall | None:
    if step.tool_call_id is None or state.turn is None:
        return None
    return state.turn.tool_call(step.tool_call_id)


def new_step(turn: Turn, type_: StepType, queue: str, retry: Retry, now: float) -> Step:
    step = Step(
        id=f"{turn.number}.{len(turn.steps) + 1}",
        type=type_,
        queue=queue,
        retry=retry,
        created_at=now,
    )
    turn.steps.append(step)
    return step


def end_attempt(
    step: Step, outcome: AttemptOutcome, now: float, error: AttemptError | None = None
) -> None:
    attempt = step.attempts[-1]
    attempt.outcome = outcome
    attempt.ended_at = now
    attempt.error = error


def end_unfinished(
    state: SessionState,
    step: Step,
    outcome: AttemptOutcome,
    now: float,
    t: Transition,
    error: AttemptError | None = None,
) -> None:
    """An attempt ends without its result. A model's partial text streamed to subscribers
    is void: ``model.discard`` tells them to drop it before a retry streams anew."""
    end_attempt(step, outcome, now, error)
    if step.type == StepType.RUN_MODEL:
        aid = attempt_id(state.id, step.id, step.attempts[-1].number)
        t.events.append({"type": "model.discard", "step_id": step.id, "attempt_id": aid})

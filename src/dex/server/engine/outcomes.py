"""The tool-call outcome route: how a call settles when its Step fails for good (read
from ``attempt_progress``), what its check finds, how an ``outcome_unknown`` call is
reconciled, and what a failed turn tells the next model about the calls that ran."""

from __future__ import annotations

import json
from typing import Any

import orjson

from dex.errors import Conflict, InvalidInput
from dex.server.engine.state import AttemptError, Retry, SessionState, Step, ToolCall
from dex.server.engine.steps import current_turn, new_step, tool_queue
from dex.server.engine.transition import Transition, append_history
from dex.wire import (
    MAX_JSON_DEPTH,
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AgentSpec,
    AttemptProgress,
    NoteItem,
    StepType,
    ToolCallStatus,
    ToolKind,
    ToolOutcome,
)


def settle_failed_call(call: ToolCall, step: Step, error: AttemptError, t: Transition) -> None:
    """The failure route: reads ``attempt_progress`` (a call that ran before is never
    NOT_STARTED)."""
    if not call.started and error.attempt_progress != AttemptProgress.NOT_COMPLETED:
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
        t.unknown.append((call, step))


def settle_checked(call: ToolCall, outcome: ToolOutcome, now: float) -> None:
    """A CheckToolCall Step ended: what the check found settles the ``outcome_unknown``
    call (it happened: succeeded; it did not: failed, as a call that never ran); a check
    that could not tell leaves the outcome unknown."""
    call.checking = False
    if outcome.status == "checked" and outcome.happened is True:
        call.status = ToolCallStatus.SUCCEEDED
        call.result = outcome.result
        call.reconciled = {"status": "succeeded", "by": "check", "at": now, "was": call.error}
        call.error = None
    elif outcome.status == "checked" and outcome.happened is False:
        call.status = ToolCallStatus.FAILED
        call.reconciled = {"status": "failed", "by": "check", "at": now, "was": call.error}
        call.error = f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: its check found no effect"


def maybe_check(
    state: SessionState, spec: AgentSpec, call: ToolCall, now: float, t: Transition
) -> None:
    """An outcome_unknown call whose tool has a check: run the check (a read) first."""
    tool = spec.tool(call.name)
    turn = current_turn(state)
    if tool is None or not tool.has_check or call.checking:
        return
    if any(s.type == StepType.CHECK_TOOL_CALL and s.tool_call_id == call.id for s in turn.steps):
        return  # checked once already
    call.checking = True
    step = new_step(
        turn, StepType.CHECK_TOOL_CALL, tool_queue(spec.name, tool.name), Retry.of(tool.retry), now
    )
    step.tool_call_id = call.id
    t.ready.append(step)


def reconcile_call(
    state: SessionState,
    call: ToolCall,
    ended: bool,
    status: str,
    result: Any,
    error: str | None,
    by: str | None,
    now: float,
) -> Transition:
    """Reconcile ``call``, of the current turn or (``ended``) of an ended one; the note
    goes into the history."""
    t = Transition()
    append_history(state, t, reconcile(call, status, result, error, by, now))
    if ended:
        state.unknown_ended = max(0, state.unknown_ended - 1)
    return t


def reconcile(
    call: ToolCall, status: str, result: Any, error: str | None, by: str | None, now: float
) -> NoteItem:
    """Record what really happened to an ``outcome_unknown`` call; the model is told."""
    problem = json_problem(result)
    if problem is not None:
        raise InvalidInput(f"the result cannot be recorded: {problem}")
    if call.status != ToolCallStatus.OUTCOME_UNKNOWN or call.checking:
        raise Conflict(f"tool call {call.id} is {call.status.value}, not outcome_unknown")
    if status not in ("succeeded", "failed"):
        raise Conflict("a reconciled call either succeeded or failed")
    call.reconciled = {"status": status, "by": by, "at": now, "was": call.error}
    call.status = ToolCallStatus(status)
    if status == "succeeded":
        call.result = result
        call.error = None
        outcome = f"it succeeded with result {json.dumps(result)}"
    else:
        call.error = error or "it failed"
        outcome = f"it failed: {call.error}"
    who = f" by {by}" if by else ""
    return NoteItem(
        text=f"The outcome of tool call {call.name}({json.dumps(call.arguments, sort_keys=True)})"
        f" (call {call.model_call_id}) was unknown; it was reconciled{who}: {outcome}."
    )


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` cannot be stored and rendered as JSON (too deep, a lone surrogate in a
    string, an integer beyond 64 bits), or None if it can."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                return f"it nests arrays and objects more than {max_depth} levels deep"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as e:
        return f"it is not representable as JSON ({e})"
    return None


def may_have_run(call: ToolCall) -> bool:
    """Whether the call's tool may have run: one of its attempts reached a Worker."""
    return call.started and call.status != ToolCallStatus.DENIED


def failed_turn_note(calls: list[ToolCall]) -> str:
    lines = [
        "The previous turn failed before the model could answer. These tool calls already"
        " ran; do not repeat them:"
    ]
    for call in calls:
        args = json.dumps(call.arguments, sort_keys=True)
        outcome = json.dumps(call.result) if call.status == ToolCallStatus.SUCCEEDED else call.error
        lines.append(f"- {call.name}({args}) -> {call.status.value}: {outcome}")
    return "\n".join(lines)

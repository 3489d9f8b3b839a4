"""Waits that live in the server: a tool call waiting for an approval, an answer or a
timer. A resolution is recorded in the session's inbox first (``record_input``), and
applied in a later commit (``apply_input``)."""

from __future__ import annotations

from typing import Any

from dex.errors import Conflict
from dex.server.engine.state import SINGLE_ATTEMPT, SessionState, Step, ToolCall, Turn, Wait
from dex.server.engine.steps import find_call, find_step, new_step
from dex.server.engine.transition import Transition
from dex.server.engine.turn import after_tool_call, queue_tool
from dex.wire import AgentSpec, StepStatus, StepType, ToolCallStatus


def start_wait(
    turn: Turn, call: ToolCall, type_: StepType, now: float, wait: Wait, t: Transition
) -> Step:
    step = new_step(turn, type_, "", SINGLE_ATTEMPT, now)
    step.status = StepStatus.WAITING
    step.tool_call_id = call.id
    step.wait = wait
    call.step_id = step.id
    t.events.append(
        {
            "type": "wait.started",
            "turn": turn.number,
            "wait": type_.value,
            "call_id": call.id,
            "tool": call.name,
            "arguments": call.arguments,
            "question": wait.question,
            "choices": wait.choices,
            "deadline": wait.deadline,
        }
    )
    return step


def end_wait(step: Step, now: float, resolution: dict[str, Any]) -> None:
    assert step.wait is not None
    step.wait.resolved_at = now
    step.wait.resolution = resolution
    if step.status == StepStatus.WAITING:
        step.status = StepStatus.SUCCEEDED
        step.ended_at = now


def record_input(state: SessionState, entry: dict[str, Any], now: float) -> None:
    """Record a resolution (approve, deny, answer, timer) in the inbox, to be applied by
    ``apply_input`` in a later commit. Refuses what cannot apply, changing nothing."""
    kind = entry["kind"]
    call = find_call(state, entry["call_id"])
    wait_type = {
        "approve": StepType.AWAIT_TOOL_APPROVAL,
        "deny": StepType.AWAIT_TOOL_APPROVAL,
        "answer": StepType.AWAIT_QUESTION_ANSWER,
        "timer": StepType.AWAIT_TIMER,
    }[kind]
    step = find_step(state, call.step_id or "")
    if step.type != wait_type or step.status != StepStatus.WAITING:
        raise Conflict(f"tool call {call.id} is not waiting for {wait_type.value}")
    if any(e["call_id"] == call.id for e in state.inbox):
        raise Conflict(f"tool call {call.id}'s wait is already resolved")
    if kind == "approve":
        expected = entry.get("arguments_hash")
        if expected is not None and expected != call.arguments_hash:
            raise Conflict(
                "the approval is for other arguments than this call's",
                arguments_hash=call.arguments_hash,
            )
        entry["arguments_hash"] = call.arguments_hash
    if kind == "answer":
        choices = step.wait.choices if step.wait else None
        if choices and entry["answer"] not in choices:
            raise Conflict(f"the answer must be one of {choices}")
    entry["step_id"] = step.id
    entry["recorded_at"] = now
    state.inbox.append(entry)


def apply_input(state: SessionState, spec: AgentSpec, now: float) -> Transition:
    """Apply the oldest recorded input. Running it again after a crash is harmless: the
    input stays in the inbox until this handler's commit."""
    t = Transition()
    if not state.inbox:
        return t
    entry = state.inbox.pop(0)
    turn = state.turn
    step = turn.step(entry["step_id"]) if turn else None
    if step is None or step.status != StepStatus.WAITING or turn is None:
        return t  # the turn ended meanwhile (cancelled): nothing to move on
    call = find_call(state, entry["call_id"])
    resolution = {k: v for k, v in entry.items() if k not in ("call_id", "step_id")}
    end_wait(step, now, resolution)
    kind = entry["kind"]
    if kind == "approve":
        call.approval = {"approved": True, **resolution}
        queue_tool(state, spec, call, now, t)
    elif kind == "deny":
        call.approval = {"approved": False, **resolution}
        call.status = ToolCallStatus.DENIED
        call.error = f"denied: {entry.get('reason') or 'no reason given'}"
        after_tool_call(state, spec, now, t)
    elif kind == "answer":
        call.answers.append(entry["answer"])
        queue_tool(state, spec, call, now, t)
    else:  # timer
        call.sleeps_done += 1
        queue_tool(state, spec, call, now, t)
    return t

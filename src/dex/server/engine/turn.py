"""How a turn moves: it starts, calls the model (compacting first when the history grew),
runs the tool calls of each response, calls the model again when all have settled, and
ends."""

from __future__ import annotations

from typing import Any

import msgspec

from dex.server.engine.outcomes import failed_turn_note, may_have_run, maybe_check
from dex.server.engine.state import (
    SINGLE_ATTEMPT,
    QueuedMessage,
    Retry,
    SessionState,
    SessionStatus,
    ToolCall,
    Turn,
    TurnStatus,
    Wait,
    attempt_id,
)
from dex.server.engine.steps import current_turn, end_unfinished, model_queue, new_step, tool_queue
from dex.server.engine.transition import Transition, append_history
from dex.wire import (
    AgentSpec,
    AttemptOutcome,
    NoteItem,
    StepStatus,
    StepType,
    ToolCallStatus,
    ToolKind,
    ToolResultItem,
    UserItem,
)


def start_turn(
    state: SessionState, spec: AgentSpec, message: QueuedMessage, now: float, t: Transition
) -> None:
    turn = Turn(
        number=message.number,
        message_id=message.message_id,
        started_at=now,
        history_start=state.history_length + len(t.history),
    )
    state.turn = turn
    state.status = SessionStatus.RUNNING
    append_history(state, t, UserItem(text=message.text))
    t.events.append({"type": "turn.started", "turn": turn.number})
    call_model(state, spec, now, t)


def steer(state: SessionState, turn: Turn, text: str, t: Transition) -> None:
    """A user message joins the running turn. If the turn's latest Step is a model call
    that waits in the queue, the message joins the history now (the call reads the history
    when it is handed out); else it waits in ``turn.steered`` for the turn's next model
    call: a model call that runs is not interrupted, and a user message between a model's
    tool calls and their results is refused by model APIs."""
    latest = turn.steps[-1] if turn.steps else None
    if latest is not None and latest.type in MODEL_STEPS and latest.status == StepStatus.QUEUED:
        append_history(state, t, UserItem(text=text))
    else:
        turn.steered.append(text)


def _steered_in(state: SessionState, turn: Turn, t: Transition) -> None:
    """The messages steered into the turn join its history (before its next model call,
    or as it ends)."""
    for text in turn.steered:
        append_history(state, t, UserItem(text=text))
    turn.steered = []


def call_model(state: SessionState, spec: AgentSpec, now: float, t: Transition) -> None:
    """The next model call: compact the history first if it grew past the threshold and
    there is something before the current turn to compact (the turn's items stay). With
    the session's budget used up, the turn waits for a bigger one instead. Messages
    steered into the turn join the history first."""
    turn = current_turn(state)
    if turn.steered:
        _steered_in(state, turn, t)
    if state.budget is not None:
        reason = state.budget.reached(state.usage)
        if reason is not None:
            await_budget(state, turn, msgspec.to_builtins(state.budget), reason, now, t)
            return
    threshold = spec.compact_threshold_chars
    if (
        threshold is not None
        and state.context_chars > threshold
        and turn.history_start > state.context_start
    ):
        step = new_step(
            turn, StepType.COMPACT_CONTEXT, model_queue(spec.name), Retry.of(spec.model_retry), now
        )
    else:
        retry = Retry.of(spec.model_retry)
        step = new_step(turn, StepType.RUN_MODEL, model_queue(spec.name), retry, now)
    t.ready.append(step)


def await_budget(
    state: SessionState,
    turn: Turn,
    budget: dict[str, Any],
    reason: str,
    now: float,
    t: Transition,
    tenant: str | None = None,
) -> None:
    """The turn waits for a bigger budget (its session's, or its ``tenant``'s): an
    ``AwaitBudget`` Step, in place of the model call it would start. ``budget``: the one
    reached, as the event shows it."""
    step = new_step(turn, StepType.AWAIT_BUDGET, "", SINGLE_ATTEMPT, now)
    step.status = StepStatus.WAITING
    step.wait = Wait(since=now, reason=reason, tenant=tenant)
    t.events.append(
        {
            "type": "wait.started",
            "turn": turn.number,
            "wait": StepType.AWAIT_BUDGET.value,
            "step_id": step.id,
            "reason": reason,
            "tenant": tenant,
            "budget": budget,
            "usage": {"tokens": state.usage.tokens, "cost_usd": state.usage.cost_usd},
        }
    )


def hold_for_tenant(
    state: SessionState, t: Transition, budget: dict[str, Any], reason: str, now: float
) -> None:
    """The model call ``t`` queued waits for the session's tenant's budget instead
    (``reason``: how much of it is used): the Step, new and never committed, is replaced by
    an ``AwaitBudget`` Step waiting on the tenant. A model call ``t`` queued again (a
    retry) runs: as with a session's budget, one queued under the budget runs to its end."""
    turn = state.turn
    if turn is None:
        return
    for step in t.ready:
        if step.type in MODEL_STEPS and not step.attempts and turn.steps[-1] is step:
            t.ready.remove(step)
            turn.steps.pop()
            await_budget(state, turn, budget, reason, now, t, tenant=state.tenant)
            return


MODEL_STEPS = (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT)


def queue_tool(
    state: SessionState, spec: AgentSpec, call: ToolCall, now: float, t: Transition
) -> None:
    """A Step that runs the call's tool (again, after an approval, answer or timer)."""
    tool = spec.tool(call.name)
    assert tool is not None
    single = tool.kind == ToolKind.WRITE
    step = new_step(
        current_turn(state),
        StepType.CALL_SINGLE_ATTEMPT_TOOL if single else StepType.CALL_TOOL,
        tool_queue(spec.name, tool.name),
        SINGLE_ATTEMPT if single else Retry.of(tool.retry),
        now,
    )
    step.tool_call_id = call.id
    call.step_id = step.id
    call.status = ToolCallStatus.PENDING
    t.ready.append(step)


def after_tool_call(state: SessionState, spec: AgentSpec, now: float, t: Transition) -> None:
    """When every call of the latest model response has settled, the model runs again."""
    turn = current_turn(state)
    calls = [turn.tool_call(call_id) for call_id in turn.batch]
    for call in calls:
        if call is not None and call.status == ToolCallStatus.OUTCOME_UNKNOWN:
            maybe_check(state, spec, call, now, t)
    if not all(c is not None and c.settled for c in calls):
        return
    for call in calls:
        assert call is not None
        append_history(
            state,
            t,
            ToolResultItem(
                call_id=call.model_call_id,
                name=call.name,
                status=call.status,
                result=call.result,
                error=call.error,
            ),
        )
    turn.batch = []
    call_model(state, spec, now, t)


def end_turn(
    state: SessionState,
    spec: AgentSpec,
    status: TurnStatus,
    now: float,
    t: Transition,
    *,
    text: str | None = None,
    error: str | None = None,
) -> None:
    turn = current_turn(state)
    turn.status = status
    turn.ended_at = now
    turn.text = text
    turn.error = error
    for step in turn.steps:
        if step.status in (StepStatus.QUEUED, StepStatus.RUNNING, StepStatus.WAITING):
            if step.current is not None:
                t.cancel.append(attempt_id(state.id, step.id, step.current.number))
                end_unfinished(state, step, AttemptOutcome.CANCELLED, now, t)
            step.status = StepStatus.CANCELLED
            step.ended_at = now
    if turn.steered:  # the turn failed or was cancelled first: they stay on record
        _steered_in(state, turn, t)
    if status != TurnStatus.COMPLETED:
        ran = [c for c in turn.tool_calls if may_have_run(c)]
        if ran:
            append_history(state, t, NoteItem(text=failed_turn_note(ran)))
    t.ended_turn = turn
    t.events.append({"type": f"turn.{status.value}", "turn": turn.number})
    state.last_turn_status = status
    state.unknown_ended += sum(c.status == ToolCallStatus.OUTCOME_UNKNOWN for c in turn.tool_calls)
    state.turn = None
    state.status = SessionStatus.IDLE
    if state.queued:
        start_turn(state, spec, state.queued.pop(0), now, t)

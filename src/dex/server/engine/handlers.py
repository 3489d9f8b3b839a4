"""Pure turn handlers: (session state, input) -> transition.

Each handler first checks that the input applies (raising ``NotFound`` or
``Conflict`` without touching the state), then mutates the state it was given
and returns a ``Transition`` that lists what else must be written (history
items, an ended turn) and what must happen once the commit is durable (Steps to
dispatch, timers to arm, attempts to cancel, turn waiters to wake). The caller
owns the state: if its commit fails it throws this state away and reloads it
from storage.

No I/O, no clock: ``now`` is an argument.

This module holds the handlers that the server calls, one for each input; the engine's
other modules hold what they share: ``transition`` (what a handler returns), ``steps``
(finding and adding Steps, ending attempts), ``turn`` (how a turn moves on), ``waits``
(approvals, answers and timers; their handlers are re-exported here) and ``outcomes``
(how a tool call settles when its Step fails, its check, reconciliation).

How a turn moves: user message -> [CompactContext] -> RunModel -> for each tool
call [AwaitToolApproval] -> CallTool | CallSingleAttemptTool | (start, then
PollToolTask) [-> AwaitQuestionAnswer | AwaitTimer -> the tool again] -> when every
call of that response has settled [-> CheckToolCall for an outcome_unknown with a
check] -> RunModel -> ... -> an answer without tool calls ends the turn.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from dex.errors import Conflict
from dex.server.engine.budget import FREE, Budget, Price, record_usage
from dex.server.engine.outcomes import reconcile_call, settle_checked, settle_failed_call
from dex.server.engine.state import (
    Attempt,
    AttemptError,
    QueuedMessage,
    SendOutcome,
    Sent,
    SessionState,
    Step,
    ToolCall,
    TurnStatus,
    Wait,
    attempt_id,
)
from dex.server.engine.steps import (
    call_of,
    current_turn,
    end_attempt,
    end_unfinished,
    find_step,
    new_step,
    running_step,
)
from dex.server.engine.transition import Transition, append_history, merge
from dex.server.engine.turn import (
    after_tool_call,
    call_model,
    end_turn,
    queue_tool,
    start_turn,
    steer,
)
from dex.server.engine.waits import apply_input, end_wait, record_input, start_wait
from dex.wire import (
    AgentSpec,
    Approval,
    AssistantItem,
    AttemptOutcome,
    AttemptProgress,
    ModelResponse,
    OnBusy,
    StepStatus,
    StepType,
    Summary,
    SummaryItem,
    ToolCallStatus,
    ToolKind,
    ToolOutcome,
)

__all__ = [
    "Transition",
    "apply_input",
    "arguments_hash",
    "assign",
    "cancel_turn",
    "complete_model",
    "complete_summary",
    "complete_tool",
    "fail_attempt",
    "hand_back",
    "receive_message",
    "reconcile_call",
    "record_input",
    "recover",
    "set_budget",
]


def arguments_hash(arguments: dict[str, Any]) -> str:
    """What an approval is bound to: a hash of the call's exact arguments."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- inputs from clients ----------------------------------------------------------


def receive_message(
    state: SessionState,
    spec: AgentSpec,
    text: str,
    message_id: str | None,
    now: float,
    on_busy: OnBusy | None = None,
) -> tuple[Transition, int]:
    """A user message: starts a turn if the session is idle; else ``on_busy`` (the agent's
    ``on_busy`` if None) decides: wait for the running turn to end (``enqueue``), refuse
    (``reject``: ``Conflict``, nothing changes), cancel the running turn and start one at
    once (``interrupt``), or join the running turn (``steer``). ``Transition.sent`` says
    which, and the turn that answers the message (also returned)."""
    policy = on_busy or spec.on_busy
    turn = state.turn
    if turn is not None and policy == "reject":
        raise Conflict(
            f"session {state.id} is running turn {turn.number}: the message was refused "
            "(on_busy reject); send it once the turn has ended, or with another on_busy",
            session_id=state.id,
            turn=turn.number,
        )
    t = Transition()
    if turn is not None and policy == "steer":
        steer(state, turn, text, t)
        t.events.append({"type": "message.steered", "turn": turn.number})
        t.sent = Sent(turn=turn.number, outcome=SendOutcome.STEERED)
        return t, turn.number
    state.messages_received += 1
    number = state.messages_received
    message = QueuedMessage(number=number, text=text, message_id=message_id)
    if turn is None:
        start_turn(state, spec, message, now, t)
        t.sent = Sent(turn=number, outcome=SendOutcome.STARTED)
    elif policy == "interrupt":
        # the cancelled turn's end starts the next queued message: this one, or those that
        # came before it first (turns run in the order of their numbers, which forks, the
        # console and every reader of the history by turn rely on)
        state.queued.append(message)
        merge(t, cancel_turn(state, spec, now, f"interrupted by message {number}"))
        t.sent = Sent(turn=number, outcome=SendOutcome.INTERRUPTED, interrupted=turn.number)
    else:
        state.queued.append(message)
        t.events.append({"type": "message.queued", "turn": number})
        t.sent = Sent(turn=number, outcome=SendOutcome.QUEUED)
    return t, number


def cancel_turn(state: SessionState, spec: AgentSpec, now: float, reason: str) -> Transition:
    """Queued Steps fail as NOT_STARTED, running attempts are cancelled, waits end."""
    turn = current_turn(state)
    t = Transition()
    error = AttemptError(message=f"the turn was cancelled: {reason}", retryable=False)
    for step in turn.steps:
        if step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED):
            continue
        if step.current is not None:
            t.cancel.append(attempt_id(state.id, step.id, step.current.number))
            end_unfinished(state, step, AttemptOutcome.CANCELLED, now, t, error)
        step.status = StepStatus.CANCELLED
        step.ended_at = now
        if step.wait is not None:
            end_wait(step, now, {"kind": "cancelled", "reason": reason})
        call = call_of(state, step)
        if call is not None and not call.settled:
            call.checking = False
            if not call.status.terminal:
                settle_failed_call(call, step, error, t)
    state.inbox = []
    end_turn(state, spec, TurnStatus.CANCELLED, now, t, error=f"cancelled: {reason}")
    return t


def set_budget(
    state: SessionState,
    spec: AgentSpec,
    budget: Budget | None,
    by: str | None,
    now: float,
    tenant_reason: str | None = None,
) -> Transition:
    """A new budget for the session (None: no limit). A turn that waits for a budget goes
    on if neither the new one nor its tenant's (``tenant_reason``: why the tenant's is used
    up, None if it is not) is used up: the model call it waited to start is queued, once
    (the wait has ended, so a second change finds nothing waiting)."""
    t = Transition()
    state.budget = budget
    t.events.append({"type": "budget.changed", "budget": _budget_json(budget), "by": by})
    _recheck_budget(state, spec, now, t, tenant_reason, {"budget": _budget_json(budget)}, by)
    return t


def recheck_budget(
    state: SessionState, spec: AgentSpec, tenant_reason: str | None, by: str | None, now: float
) -> Transition:
    """The session's tenant's budget changed, or its day or month ended: a turn that waits
    for a budget goes on if neither its session's nor its tenant's (``tenant_reason``, as
    in ``set_budget``) is used up."""
    t = Transition()
    _recheck_budget(state, spec, now, t, tenant_reason, {"tenant": state.tenant}, by)
    return t


def _recheck_budget(
    state: SessionState,
    spec: AgentSpec,
    now: float,
    t: Transition,
    tenant_reason: str | None,
    resolution: dict[str, Any],
    by: str | None,
) -> None:
    turn = state.turn
    waiting = [
        step
        for step in (turn.steps if turn is not None else [])
        if step.type == StepType.AWAIT_BUDGET and step.status == StepStatus.WAITING
    ]
    for step in waiting:
        assert turn is not None and step.wait is not None
        reason = state.budget.reached(state.usage) if state.budget is not None else None
        if reason is not None or tenant_reason is not None:
            step.wait.reason = reason or tenant_reason  # it still waits: for what, now
            step.wait.tenant = None if reason is not None else state.tenant
            continue
        ended = {"kind": "budget", **resolution, "by": by}
        end_wait(step, now, ended)
        t.events.append(
            {"type": "wait.ended", "turn": turn.number, "wait": step.type.value, **ended}
        )
        call_model(state, spec, now, t)


def _budget_json(budget: Budget | None) -> dict[str, Any] | None:
    return msgspec.to_builtins(budget) if budget is not None else None


# --- inputs from the dispatcher and Workers ------------------------------------------


def assign(
    state: SessionState, step_id: str, worker_id: str, now: float, proof: str = ""
) -> Attempt:
    """Hand a queued Step to a Worker (``proof``: its connection's, ``Attempt.proof``):
    its next attempt starts."""
    step = find_step(state, step_id)
    if step.status != StepStatus.QUEUED:
        raise Conflict(f"step {step_id} is {step.status}, not queued")
    attempt = Attempt(
        number=len(step.attempts) + 1, worker_id=worker_id, started_at=now, proof=proof
    )
    step.attempts.append(attempt)
    step.status = StepStatus.RUNNING
    step.not_before = None
    call = call_of(state, step)
    if call is not None and step.type != StepType.CHECK_TOOL_CALL:
        call.status = ToolCallStatus.RUNNING
        call.started = True
    return attempt


def complete_model(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    response: ModelResponse,
    now: float,
    *,
    price: Price = FREE,
) -> Transition:
    """``price``: of the agent's model, to count what the call cost."""
    step = running_step(state, step_id, number, StepType.RUN_MODEL)
    turn = current_turn(state)
    t = Transition()
    end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    step.usage = response.usage.model_dump()
    t.used = record_usage(state.usage, turn.usage, step.usage, price)
    step.cost_usd = t.used[2]
    step.stop_reason = response.stop_reason
    append_history(
        state,
        t,
        AssistantItem(text=response.text, tool_calls=response.tool_calls, state=response.state),
    )
    if not response.tool_calls:
        if turn.steered:  # a message steered in while the model ran: the model answers it
            call_model(state, spec, now, t)
        else:
            end_turn(state, spec, TurnStatus.COMPLETED, now, t, text=response.text)
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
            arguments_hash=arguments_hash(model_call.arguments),
        )
        turn.tool_calls.append(call)
        turn.batch.append(call.id)
        if tool is None:
            known = ", ".join(sorted(s.name for s in spec.tools)) or "none"
            call.status = ToolCallStatus.FAILED
            call.error = f"unknown tool {model_call.name!r}; the tools are: {known}"
        elif tool.approval == Approval.ALWAYS or (
            tool.approval == Approval.PREDICATE and model_call.id in response.approval_required
        ):
            start_wait(turn, call, StepType.AWAIT_TOOL_APPROVAL, now, Wait(since=now), t)
        else:
            queue_tool(state, spec, call, now, t)
    after_tool_call(state, spec, now, t)
    return t


def complete_summary(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    summary: Summary,
    now: float,
    *,
    price: Price = FREE,
) -> Transition:
    step = running_step(state, step_id, number, StepType.COMPACT_CONTEXT)
    t = Transition()
    end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    step.usage = summary.usage.model_dump()
    turn = current_turn(state)
    t.used = record_usage(state.usage, turn.usage, step.usage, price)
    step.cost_usd = t.used[2]
    start = state.history_length + len(t.history)
    append_history(state, t, SummaryItem(text=summary.text))
    # the summary replaces what came before the turn; the turn's own items stay
    state.context_start, state.summary_at = turn.history_start, start
    state.context_chars = len(summary.text) + turn.history_chars
    call_model(state, spec, now, t)  # nothing before the turn is left to compact: RunModel
    return t


def complete_tool(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    outcome: ToolOutcome,
    now: float,
) -> Transition:
    step = running_step(
        state,
        step_id,
        number,
        StepType.CALL_TOOL,
        StepType.CALL_SINGLE_ATTEMPT_TOOL,
        StepType.POLL_TOOL_TASK,
        StepType.CHECK_TOOL_CALL,
    )
    call = call_of(state, step)
    assert call is not None
    turn = current_turn(state)
    tool = spec.tool(call.name)
    t = Transition()
    end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    status = outcome.status
    if step.type == StepType.CHECK_TOOL_CALL:
        settle_checked(call, outcome, now)
    elif status == "succeeded" and call.kind == ToolKind.TASK and step.type == StepType.CALL_TOOL:
        call.task_handle = outcome.result  # the task started: poll it
        call.status = ToolCallStatus.RUNNING
        interval = tool.poll_interval_seconds if tool else 1.0
        poll = new_step(turn, StepType.POLL_TOOL_TASK, step.queue, step.retry, now)
        poll.tool_call_id = call.id
        poll.not_before = now + interval
        call.step_id = poll.id
        t.ready.append(poll)
        return t
    elif status == "pending":
        if step.type != StepType.POLL_TOOL_TASK:
            raise Conflict("only a PollToolTask Step may report its task pending")
        # the same Step polls again after the interval; attempts count per poll, and
        # every attempt of every poll stays on record (numbered on)
        step.polls += 1
        step.poll_start = len(step.attempts)
        step.status = StepStatus.QUEUED
        step.ended_at = None
        step.not_before = now + (tool.poll_interval_seconds if tool else 1.0)
        call.status = ToolCallStatus.RUNNING
        t.ready.append(step)
        return t
    elif status == "asked":
        call.questions.append({"question": outcome.question, "choices": outcome.choices})
        call.status = ToolCallStatus.PENDING
        start_wait(
            turn,
            call,
            StepType.AWAIT_QUESTION_ANSWER,
            now,
            Wait(since=now, question=outcome.question, choices=outcome.choices),
            t,
        )
        return t
    elif status == "sleep":
        call.status = ToolCallStatus.PENDING
        timer = start_wait(
            turn,
            call,
            StepType.AWAIT_TIMER,
            now,
            Wait(since=now, deadline=now + (outcome.sleep_seconds or 0.0)),
            t,
        )
        t.timers.append(timer)
        return t
    elif status == "succeeded":
        call.status = ToolCallStatus.SUCCEEDED
        call.result = outcome.result
    elif status == "failed":
        call.status = ToolCallStatus.FAILED
        call.error = outcome.error or "the tool failed"
    else:
        raise Conflict(f"a {step.type.value} Step cannot end as {status!r}")
    after_tool_call(state, spec, now, t)
    return t


def fail_attempt(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    error: AttemptError,
    now: float,
    *,
    backoff: bool = True,
) -> Transition:
    """An attempt failed: retry the Step if its policy allows, else fail it for good.

    ``backoff`` False retries at once: the server, not the Step's code, lost the attempt
    (its Worker died or went silent, or the node restarted), so another Worker may take
    it now."""
    step = running_step(state, step_id, number)
    t = Transition()
    end_unfinished(state, step, AttemptOutcome.FAILED, now, t, error)
    these = step.attempts[step.poll_start :]  # a poll's attempts count per poll
    used = len(these)
    first = these[0].started_at
    delay = step.retry.backoff(used) if backoff else 0.0
    if (
        error.retryable
        and used < step.retry.max_attempts
        and now + delay < first + step.retry.within_seconds
    ):
        step.status = StepStatus.QUEUED
        step.not_before = now + delay if delay > 0 else None
        call = call_of(state, step)
        if call is not None and step.type != StepType.CHECK_TOOL_CALL:
            call.status = ToolCallStatus.PENDING
        t.ready.append(step)
        return t
    _fail_step(state, spec, step, error, now, t)
    return t


def _fail_step(
    state: SessionState,
    spec: AgentSpec,
    step: Step,
    error: AttemptError,
    now: float,
    t: Transition,
) -> None:
    step.status = StepStatus.FAILED
    step.ended_at = now
    call = call_of(state, step)
    started = bool(step.attempts) or (call is not None and call.started)
    progress = AttemptProgress.NOT_COMPLETED if started else AttemptProgress.NOT_STARTED
    step.error = msgspec.structs.replace(error, attempt_progress=progress)
    if call is None:  # RunModel or CompactContext
        what = "compacting the context" if step.type == StepType.COMPACT_CONTEXT else "RunModel"
        end_turn(state, spec, TurnStatus.FAILED, now, t, error=f"{what} failed: {error.message}")
        return
    if step.type == StepType.CHECK_TOOL_CALL:
        call.checking = False  # the outcome stays unknown
    else:
        settle_failed_call(call, step, step.error, t)
    after_tool_call(state, spec, now, t)


def hand_back(state: SessionState, step_id: str, number: int) -> Transition:
    """A Worker returns an attempt it never started: the Step queues again, no attempt used."""
    step = running_step(state, step_id, number)
    step.attempts.pop()
    step.handed_back += 1
    step.status = StepStatus.QUEUED
    call = call_of(state, step)
    if call is not None and step.type != StepType.CHECK_TOOL_CALL:
        call.status = ToolCallStatus.PENDING
        call.started = (
            bool(call.questions)
            or call.sleeps_done > 0
            or any(
                s.attempts
                for s in current_turn(state).steps
                if s.tool_call_id == call.id and s.type != StepType.CHECK_TOOL_CALL
            )
        )
    return Transition(ready=[step])


RATE_LIMIT_BACKOFF = (1.0, 60.0)
"""Without the provider's ``Retry-After``: the wait after a model call's first refusal,
doubled at each further one of the same Step, up to the second figure."""


def rate_limited(
    state: SessionState, step_id: str, number: int, now: float, retry_after: float | None
) -> Transition:
    """The model provider refused the call for its rate limit or its load, and nothing
    ran: the Step queues again and uses no attempt (``hand_back``), and is handed out
    again after ``retry_after`` seconds (the provider's ``Retry-After``), or a backoff that
    doubles with each refusal of the Step's call. A rate limit never fails a turn."""
    t = hand_back(state, step_id, number)
    step = t.ready[0]
    step.rate_limited += 1
    if retry_after is None:
        first, most = RATE_LIMIT_BACKOFF
        retry_after = min(most, first * 2 ** (step.rate_limited - 1))
    step.not_before = now + retry_after
    return t


def recover(
    state: SessionState,
    spec: AgentSpec,
    now: float,
    reason: str,
    kept: frozenset[str] = frozenset(),
) -> Transition:
    """Fail every attempt that was handed out and not committed (a node starts or takes
    over), but those of the Steps in ``kept`` (they wait for their Worker to reclaim them)."""
    t = Transition()
    for step in state.running_steps():
        attempt = step.current
        if step.status != StepStatus.RUNNING or attempt is None or step.id in kept:
            continue  # an earlier failure in this loop ended the turn
        error = AttemptError(message=reason, attempt_progress=AttemptProgress.NOT_COMPLETED)
        merge(t, fail_attempt(state, spec, step.id, attempt.number, error, now, backoff=False))
    return t

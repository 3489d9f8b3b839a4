"""Pure turn handlers: (session state, input) -> transition.

Each handler first checks that the input applies (raising ``NotFound`` or
``Conflict`` without touching the state), then mutates the state it was given
and returns a ``Transition`` that lists what else must be written (history
items, an ended turn) and what must happen once the commit is durable (Steps to
dispatch, timers to arm, attempts to cancel, turn waiters to wake). The caller
owns the state: if its commit fails it throws this state away and reloads it
from storage.

No I/O, no clock: ``now`` is an argument.

How a turn moves: user message -> [CompactContext] -> RunModel -> for each tool
call [AwaitToolApproval] -> CallTool | CallSingleAttemptTool | (start, then
PollToolTask) [-> AwaitQuestionAnswer | AwaitTimer -> the tool again] -> when every
call of that response has settled [-> CheckToolCall for an outcome_unknown with a
check] -> RunModel -> ... -> an answer without tool calls ends the turn.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from dex.errors import Conflict, InvalidInput, NotFound
from dex.server.engine.state import (
    SINGLE_ATTEMPT,
    Attempt,
    AttemptError,
    QueuedMessage,
    Retry,
    SessionState,
    SessionStatus,
    Step,
    ToolCall,
    Turn,
    TurnStatus,
    Wait,
    attempt_id,
)
from dex.wire import (
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AgentSpec,
    Approval,
    AssistantItem,
    AttemptOutcome,
    AttemptProgress,
    Item,
    ModelResponse,
    NoteItem,
    StepStatus,
    StepType,
    Summary,
    SummaryItem,
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
    timers: list[Step] = field(default_factory=list)
    """AwaitTimer Steps to arm."""
    ended_turn: Turn | None = None
    cancel: list[str] = field(default_factory=list)
    """Attempt ids whose Worker should stop."""
    events: list[dict[str, Any]] = field(default_factory=list)
    message: int | None = None
    """For a user message: its number (the number of the turn it starts, now or later)."""
    unknown: list[tuple[ToolCall, Step]] = field(default_factory=list)
    """Tool calls whose outcome became unknown, each with its failed Step (to be logged)."""


def model_queue(agent: str) -> str:
    return f"model:{agent}"


def tool_queue(agent: str, tool: str) -> str:
    return f"tool:{agent}/{tool}"


def arguments_hash(arguments: dict[str, Any]) -> str:
    """What an approval is bound to: a hash of the call's exact arguments."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- inputs from clients ----------------------------------------------------------


def receive_message(
    state: SessionState, spec: AgentSpec, text: str, message_id: str | None, now: float
) -> tuple[Transition, int]:
    """A user message: starts a turn, or waits for the running one to end."""
    t = Transition()
    state.messages_received += 1
    number = t.message = state.messages_received
    message = QueuedMessage(number=number, text=text, message_id=message_id)
    if state.status == SessionStatus.IDLE:
        _start_turn(state, spec, message, now, t)
    else:
        state.queued.append(message)
        t.events.append({"type": "message.queued", "turn": number})
    return t, number


def record_input(state: SessionState, entry: dict[str, Any], now: float) -> None:
    """Record a resolution (approve, deny, answer, timer) in the inbox, to be applied by
    ``apply_input`` in a later commit. Refuses what cannot apply, changing nothing."""
    kind = entry["kind"]
    call = _call(state, entry["call_id"])
    wait_type = {
        "approve": StepType.AWAIT_TOOL_APPROVAL,
        "deny": StepType.AWAIT_TOOL_APPROVAL,
        "answer": StepType.AWAIT_QUESTION_ANSWER,
        "timer": StepType.AWAIT_TIMER,
    }[kind]
    step = _step(state, call.step_id or "")
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
    call = _call(state, entry["call_id"])
    resolution = {k: v for k, v in entry.items() if k not in ("call_id", "step_id")}
    _end_wait(step, now, resolution)
    kind = entry["kind"]
    if kind == "approve":
        call.approval = {"approved": True, **resolution}
        _queue_tool(state, spec, call, now, t)
    elif kind == "deny":
        call.approval = {"approved": False, **resolution}
        call.status = ToolCallStatus.DENIED
        call.error = f"denied: {entry.get('reason') or 'no reason given'}"
        _after_tool_call(state, spec, now, t)
    elif kind == "answer":
        call.answers.append(entry["answer"])
        _queue_tool(state, spec, call, now, t)
    else:  # timer
        call.sleeps_done += 1
        _queue_tool(state, spec, call, now, t)
    return t


def cancel_turn(state: SessionState, spec: AgentSpec, now: float, reason: str) -> Transition:
    """Queued Steps fail as NOT_STARTED, running attempts are cancelled, waits end."""
    turn = _turn(state)
    t = Transition()
    error = AttemptError(message=f"the turn was cancelled: {reason}", retryable=False)
    for step in turn.steps:
        if step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED):
            continue
        if step.current is not None:
            t.cancel.append(attempt_id(state.id, step.id, step.current.number))
            _end_unfinished(state, step, AttemptOutcome.CANCELLED, now, t, error)
        step.status = StepStatus.CANCELLED
        step.ended_at = now
        if step.wait is not None:
            _end_wait(step, now, {"kind": "cancelled", "reason": reason})
        call = _call_of(state, step)
        if call is not None and not call.settled:
            call.checking = False
            if not call.status.terminal:
                _settle_failed_call(call, step, error, t)
    state.inbox = []
    _end_turn(state, spec, TurnStatus.CANCELLED, now, t, error=f"cancelled: {reason}")
    return t


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


MAX_JSON_DEPTH = 64
"""How deeply a client's JSON value (a reconciled result) may nest arrays and objects: it
is stored inside a turn's record, which must read back and render as JSON."""


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


# --- inputs from the dispatcher and Workers ------------------------------------------


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
) -> Transition:
    step = _running(state, step_id, number, StepType.RUN_MODEL)
    turn = _turn(state)
    t = Transition()
    _end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    step.usage = response.usage.model_dump()
    step.stop_reason = response.stop_reason
    append_history(
        state,
        t,
        AssistantItem(text=response.text, tool_calls=response.tool_calls, state=response.state),
    )
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
            _wait(turn, call, StepType.AWAIT_TOOL_APPROVAL, now, Wait(since=now), t)
        else:
            _queue_tool(state, spec, call, now, t)
    _after_tool_call(state, spec, now, t)
    return t


def complete_summary(
    state: SessionState, spec: AgentSpec, step_id: str, number: int, summary: Summary, now: float
) -> Transition:
    step = _running(state, step_id, number, StepType.COMPACT_CONTEXT)
    t = Transition()
    _end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    step.usage = summary.usage.model_dump()
    turn = _turn(state)
    start = state.history_length + len(t.history)
    append_history(state, t, SummaryItem(text=summary.text))
    # the summary replaces what came before the turn; the turn's own items stay
    state.context_start, state.summary_at = turn.history_start, start
    state.context_chars = len(summary.text) + turn.history_chars
    retry = Retry.of(spec.model_retry)
    t.ready.append(_new_step(_turn(state), StepType.RUN_MODEL, model_queue(spec.name), retry, now))
    return t


def complete_tool(
    state: SessionState,
    spec: AgentSpec,
    step_id: str,
    number: int,
    outcome: ToolOutcome,
    now: float,
) -> Transition:
    step = _running(
        state,
        step_id,
        number,
        StepType.CALL_TOOL,
        StepType.CALL_SINGLE_ATTEMPT_TOOL,
        StepType.POLL_TOOL_TASK,
        StepType.CHECK_TOOL_CALL,
    )
    call = _call_of(state, step)
    assert call is not None
    turn = _turn(state)
    tool = spec.tool(call.name)
    t = Transition()
    _end_attempt(step, AttemptOutcome.SUCCEEDED, now)
    step.status = StepStatus.SUCCEEDED
    step.ended_at = now
    status = outcome.status
    if step.type == StepType.CHECK_TOOL_CALL:
        call.checking = False
        if status == "checked" and outcome.happened is True:
            call.status = ToolCallStatus.SUCCEEDED
            call.result = outcome.result
            call.reconciled = {"status": "succeeded", "by": "check", "at": now, "was": call.error}
            call.error = None
        elif status == "checked" and outcome.happened is False:
            call.status = ToolCallStatus.FAILED
            call.reconciled = {"status": "failed", "by": "check", "at": now, "was": call.error}
            call.error = f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: its check found no effect"
    elif status == "succeeded" and call.kind == ToolKind.TASK and step.type == StepType.CALL_TOOL:
        call.task_handle = outcome.result  # the task started: poll it
        call.status = ToolCallStatus.RUNNING
        interval = tool.poll_interval_seconds if tool else 1.0
        poll = _new_step(turn, StepType.POLL_TOOL_TASK, step.queue, step.retry, now)
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
        _wait(
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
        timer = _wait(
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
    _after_tool_call(state, spec, now, t)
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
    step = _running(state, step_id, number)
    t = Transition()
    _end_unfinished(state, step, AttemptOutcome.FAILED, now, t, error)
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
        call = _call_of(state, step)
        if call is not None and step.type != StepType.CHECK_TOOL_CALL:
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
    if call is not None and step.type != StepType.CHECK_TOOL_CALL:
        call.status = ToolCallStatus.PENDING
        call.started = (
            bool(call.questions)
            or call.sleeps_done > 0
            or any(
                s.attempts
                for s in _turn(state).steps
                if s.tool_call_id == call.id and s.type != StepType.CHECK_TOOL_CALL
            )
        )
    return Transition(ready=[step])


def recover(state: SessionState, spec: AgentSpec, now: float, reason: str) -> Transition:
    """Fail every attempt that was handed out and not committed (a node starts or takes over)."""
    t = Transition()
    for step in state.running_steps():
        attempt = step.current
        if step.status != StepStatus.RUNNING or attempt is None:
            continue  # an earlier failure in this loop ended the turn
        error = AttemptError(message=reason, attempt_progress=AttemptProgress.NOT_COMPLETED)
        _merge(t, fail_attempt(state, spec, step.id, attempt.number, error, now, backoff=False))
    return t


# --- the turn --------------------------------------------------------------------------


def _start_turn(
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
    _call_model(state, spec, now, t)


def _call_model(state: SessionState, spec: AgentSpec, now: float, t: Transition) -> None:
    """The next model call: compact the history first if it grew past the threshold and
    there is something before the current turn to compact (the turn's items stay)."""
    turn = _turn(state)
    threshold = spec.compact_threshold_chars
    if (
        threshold is not None
        and state.context_chars > threshold
        and turn.history_start > state.context_start
    ):
        step = _new_step(
            turn, StepType.COMPACT_CONTEXT, model_queue(spec.name), Retry.of(spec.model_retry), now
        )
    else:
        retry = Retry.of(spec.model_retry)
        step = _new_step(turn, StepType.RUN_MODEL, model_queue(spec.name), retry, now)
    t.ready.append(step)


def _queue_tool(
    state: SessionState, spec: AgentSpec, call: ToolCall, now: float, t: Transition
) -> None:
    """A Step that runs the call's tool (again, after an approval, answer or timer)."""
    tool = spec.tool(call.name)
    assert tool is not None
    single = tool.kind == ToolKind.WRITE
    step = _new_step(
        _turn(state),
        StepType.CALL_SINGLE_ATTEMPT_TOOL if single else StepType.CALL_TOOL,
        tool_queue(spec.name, tool.name),
        SINGLE_ATTEMPT if single else Retry.of(tool.retry),
        now,
    )
    step.tool_call_id = call.id
    call.step_id = step.id
    call.status = ToolCallStatus.PENDING
    t.ready.append(step)


def _after_tool_call(state: SessionState, spec: AgentSpec, now: float, t: Transition) -> None:
    """When every call of the latest model response has settled, the model runs again."""
    turn = _turn(state)
    calls = [turn.tool_call(call_id) for call_id in turn.batch]
    for call in calls:
        if call is not None and call.status == ToolCallStatus.OUTCOME_UNKNOWN:
            _maybe_check(state, spec, call, now, t)
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
    _call_model(state, spec, now, t)


def _maybe_check(
    state: SessionState, spec: AgentSpec, call: ToolCall, now: float, t: Transition
) -> None:
    """An outcome_unknown call whose tool has a check: run the check (a read) first."""
    tool = spec.tool(call.name)
    turn = _turn(state)
    if tool is None or not tool.has_check or call.checking:
        return
    if any(s.type == StepType.CHECK_TOOL_CALL and s.tool_call_id == call.id for s in turn.steps):
        return  # checked once already
    call.checking = True
    step = _new_step(
        turn, StepType.CHECK_TOOL_CALL, tool_queue(spec.name, tool.name), Retry.of(tool.retry), now
    )
    step.tool_call_id = call.id
    t.ready.append(step)


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
    call = _call_of(state, step)
    started = bool(step.attempts) or (call is not None and call.started)
    progress = AttemptProgress.NOT_COMPLETED if started else AttemptProgress.NOT_STARTED
    step.error = msgspec.structs.replace(error, attempt_progress=progress)
    if call is None:  # RunModel or CompactContext
        what = "compacting the context" if step.type == StepType.COMPACT_CONTEXT else "RunModel"
        _end_turn(state, spec, TurnStatus.FAILED, now, t, error=f"{what} failed: {error.message}")
        return
    if step.type == StepType.CHECK_TOOL_CALL:
        call.checking = False  # the outcome stays unknown
    else:
        _settle_failed_call(call, step, step.error, t)
    _after_tool_call(state, spec, now, t)


def _settle_failed_call(call: ToolCall, step: Step, error: AttemptError, t: Transition) -> None:
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
        if step.status in (StepStatus.QUEUED, StepStatus.RUNNING, StepStatus.WAITING):
            if step.current is not None:
                t.cancel.append(attempt_id(state.id, step.id, step.current.number))
                _end_unfinished(state, step, AttemptOutcome.CANCELLED, now, t)
            step.status = StepStatus.CANCELLED
            step.ended_at = now
    if status != TurnStatus.COMPLETED:
        ran = [c for c in turn.tool_calls if _ran(c)]
        if ran:
            append_history(state, t, NoteItem(text=_failed_turn_note(ran)))
    t.ended_turn = turn
    t.events.append({"type": f"turn.{status.value}", "turn": turn.number})
    state.last_turn_status = status
    state.unknown_ended += sum(c.status == ToolCallStatus.OUTCOME_UNKNOWN for c in turn.tool_calls)
    state.turn = None
    state.status = SessionStatus.IDLE
    if state.queued:
        _start_turn(state, spec, state.queued.pop(0), now, t)


def _ran(call: ToolCall) -> bool:
    """Whether the call's tool may have run: one of its attempts reached a Worker."""
    return call.started and call.status != ToolCallStatus.DENIED


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


# --- helpers ----------------------------------------------------------------------------


def _size(item: Item) -> int:
    """About how many characters the item adds to what the model reads (for compaction):
    cheap, as it runs for every item."""
    if isinstance(item, AssistantItem):
        return len(item.text) + sum(len(c.name) + len(str(c.arguments)) for c in item.tool_calls)
    if isinstance(item, ToolResultItem):
        return len(item.name) + len(str(item.result)) + len(item.error or "")
    return len(item.text)


def append_history(state: SessionState, t: Transition, item: Item) -> None:
    t.history.append(item)
    chars = _size(item)
    state.context_chars += chars
    if state.turn is not None:
        state.turn.history_chars += chars


def _new_step(turn: Turn, type_: StepType, queue: str, retry: Retry, now: float) -> Step:
    step = Step(
        id=f"{turn.number}.{len(turn.steps) + 1}",
        type=type_,
        queue=queue,
        retry=retry,
        created_at=now,
    )
    turn.steps.append(step)
    return step


def _wait(
    turn: Turn, call: ToolCall, type_: StepType, now: float, wait: Wait, t: Transition
) -> Step:
    step = _new_step(turn, type_, "", SINGLE_ATTEMPT, now)
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


def _end_wait(step: Step, now: float, resolution: dict[str, Any]) -> None:
    assert step.wait is not None
    step.wait.resolved_at = now
    step.wait.resolution = resolution
    if step.status == StepStatus.WAITING:
        step.status = StepStatus.SUCCEEDED
        step.ended_at = now


def _turn(state: SessionState) -> Turn:
    if state.turn is None:
        raise Conflict(f"session {state.id} has no running turn")
    return state.turn


def _step(state: SessionState, step_id: str) -> Step:
    step = state.turn.step(step_id) if state.turn else None
    if step is None:
        raise NotFound(f"session {state.id} has no current step {step_id}")
    return step


def _call(state: SessionState, call_id: str) -> ToolCall:
    call = state.turn.tool_call(call_id) if state.turn else None
    if call is None:
        raise NotFound(f"session {state.id} has no tool call {call_id} in its current turn")
    return call


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
    step: Step, outcome: AttemptOutcome, now: float, error: AttemptError | None = None
) -> None:
    attempt = step.attempts[-1]
    attempt.outcome = outcome
    attempt.ended_at = now
    attempt.error = error


def _end_unfinished(
    state: SessionState,
    step: Step,
    outcome: AttemptOutcome,
    now: float,
    t: Transition,
    error: AttemptError | None = None,
) -> None:
    """An attempt ends without its result. A model's partial text streamed to subscribers
    is void: ``model.discard`` tells them to drop it before a retry streams anew."""
    _end_attempt(step, outcome, now, error)
    if step.type == StepType.RUN_MODEL:
        aid = attempt_id(state.id, step.id, step.attempts[-1].number)
        t.events.append({"type": "model.discard", "step_id": step.id, "attempt_id": aid})


def _merge(into: Transition, other: Transition) -> None:
    into.history.extend(other.history)
    into.ready.extend(other.ready)
    into.timers.extend(other.timers)
    into.cancel.extend(other.cancel)
    into.events.extend(other.events)
    into.unknown.extend(other.unknown)
    if other.ended_turn is not None:
        into.ended_turn = other.ended_turn

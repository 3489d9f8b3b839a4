"""The pure turn handlers: (session state, input) -> transition.

No database, no network, no clock: every handler gets ``now`` as an argument,
and every test reads only the state and the returned ``Transition``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from dex.errors import Conflict, NotFound
from dex.server.engine import handlers
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    AttemptError,
    Retry,
    SessionState,
    SessionStatus,
    Step,
    ToolCall,
    TurnStatus,
)
from dex.wire import (
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AgentSpec,
    AssistantItem,
    AttemptOutcome,
    AttemptProgress,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    RetryPolicy,
    StepStatus,
    StepType,
    Summary,
    SummaryItem,
    ToolCallStatus,
    ToolKind,
    ToolOutcome,
    ToolResultItem,
    ToolSpec,
    UserItem,
)

SID = "s1"
AGENT = "helper"
T0 = 1_000.0

LOOKUP = ToolSpec(name="lookup", kind=ToolKind.READ)
UPSERT = ToolSpec(name="upsert", kind=ToolKind.IDEMPOTENT_WRITE)
CHARGE = ToolSpec(name="charge")  # no kind given: a write, the safest default


def make_spec(*tools: ToolSpec, model_retry: RetryPolicy | None = None) -> AgentSpec:
    spec = AgentSpec(name=AGENT, tools=list(tools or (LOOKUP, UPSERT, CHARGE)))
    if model_retry is not None:
        spec.model_retry = model_retry
    return spec


def new_state() -> SessionState:
    return SessionState(id=SID, agent=AGENT, created_at=T0)


def send(state: SessionState, spec: AgentSpec, text: str, now: float = T0) -> Transition:
    t, _ = handlers.receive_message(state, spec, text, None, now)
    return t


def model_step(state: SessionState) -> Step:
    """The latest RunModel Step of the running turn."""
    assert state.turn is not None
    return [s for s in state.turn.steps if s.type == StepType.RUN_MODEL][-1]


def answer(text: str) -> ModelResponse:
    return ModelResponse(text=text)


def asks(*calls: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    return ModelResponse(
        tool_calls=[ModelToolCall(id=cid, name=name, arguments=args) for cid, name, args in calls],
        stop_reason="tool_use",
    )


def run_model(
    state: SessionState, spec: AgentSpec, response: ModelResponse, now: float = T0
) -> Transition:
    """Hand the queued RunModel Step to a Worker and complete it with ``response``."""
    step = model_step(state)
    attempt = handlers.assign(state, step.id, "w-model", now)
    return handlers.complete_model(state, spec, step.id, attempt.number, response, now)


def ask_for_tools(
    state: SessionState, spec: AgentSpec, *calls: tuple[str, str, dict[str, Any]]
) -> Transition:
    """Start a turn and let the model answer with ``calls``."""
    send(state, spec, "please use your tools")
    return run_model(state, spec, asks(*calls))


def call_for(state: SessionState, model_call_id: str) -> ToolCall:
    assert state.turn is not None
    [call] = [c for c in state.turn.tool_calls if c.model_call_id == model_call_id]
    return call


def step_for(state: SessionState, model_call_id: str) -> Step:
    assert state.turn is not None
    call = call_for(state, model_call_id)
    assert call.step_id is not None
    step = state.turn.step(call.step_id)
    assert step is not None
    return step


def step_status(step: Step) -> StepStatus:
    """``step.status``, read afresh for mypy, which keeps an attribute narrowed by an earlier
    ``assert ... == ...`` across the handler call that changes it (python/mypy#17896)."""
    return step.status


def call_status(call: ToolCall) -> ToolCallStatus:
    """``call.status``, read afresh for mypy: see ``step_status``."""
    return call.status


def crash(message: str = "the Worker was killed") -> AttemptError:
    return AttemptError(message=message, attempt_progress=AttemptProgress.NOT_COMPLETED)


def ok(result: Any) -> ToolOutcome:
    return ToolOutcome(status="succeeded", result=result)


def complete(
    state: SessionState, spec: AgentSpec, model_call_id: str, outcome: ToolOutcome, now: float = T0
) -> Transition:
    step = step_for(state, model_call_id)
    attempt = handlers.assign(state, step.id, "w-tool", now)
    return handlers.complete_tool(state, spec, step.id, attempt.number, outcome, now)


def fail_until_done(state: SessionState, spec: AgentSpec, step: Step, now: float) -> Transition:
    """Hand out and fail attempts (honouring backoff) until the Step stops being retried."""
    t = Transition()
    while step.status == StepStatus.QUEUED:
        now = max(now, step.not_before or now)
        attempt = handlers.assign(state, step.id, f"w{len(step.attempts) + 1}", now)
        now += 0.5
        t = handlers.fail_attempt(state, spec, step.id, attempt.number, crash(), now)
    return t


# --- messages and turns ------------------------------------------------------------------


def test_a_message_on_an_idle_session_starts_turn_1_with_a_run_model_step() -> None:
    state, spec = new_state(), make_spec()

    t, number = handlers.receive_message(state, spec, "hello", "m-1", T0)

    assert number == 1
    assert state.status == SessionStatus.RUNNING
    assert state.turn is not None
    assert state.turn.number == 1
    assert state.turn.message_id == "m-1"
    assert t.history == [UserItem(text="hello")]
    [step] = t.ready
    assert step.type == StepType.RUN_MODEL
    assert step.queue == "model:helper"
    assert step.status == StepStatus.QUEUED
    assert state.turn.steps == [step]


def test_a_message_during_a_turn_waits_and_starts_the_next_turn_when_the_turn_ends() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "first")

    t2, second = handlers.receive_message(state, spec, "second", "m-2", T0 + 1)
    t3, third = handlers.receive_message(state, spec, "third", None, T0 + 2)

    assert (second, third) == (2, 3)
    assert t2.history == [] and t2.ready == [] and t3.history == [] and t3.ready == []
    assert state.turn is not None and state.turn.number == 1
    assert [m.text for m in state.queued] == ["second", "third"]

    t = run_model(state, spec, answer("done with first"), now=T0 + 3)

    assert t.ended_turn is not None
    assert t.ended_turn.number == 1
    assert t.ended_turn.status == TurnStatus.COMPLETED
    assert state.turn is not None and state.turn.number == 2
    assert state.turn.message_id == "m-2"
    assert state.status == SessionStatus.RUNNING
    assert t.history == [AssistantItem(text="done with first"), UserItem(text="second")]
    [step] = t.ready
    assert step.type == StepType.RUN_MODEL and step.queue == "model:helper"
    assert state.turn.steps == [step]
    assert [m.text for m in state.queued] == ["third"]


def test_a_final_answer_completes_the_turn_and_the_session_goes_idle() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hi")

    t = run_model(state, spec, answer("hello there"), now=T0 + 5)

    assert t.history == [AssistantItem(text="hello there")]
    assert t.ready == []
    assert t.ended_turn is not None
    assert t.ended_turn.status == TurnStatus.COMPLETED
    assert t.ended_turn.text == "hello there"
    assert t.ended_turn.ended_at == T0 + 5
    assert [s.status for s in t.ended_turn.steps] == [StepStatus.SUCCEEDED]
    assert state.turn is None
    assert state.status == SessionStatus.IDLE


# --- attempts -------------------------------------------------------------------------------


def test_attempts_are_numbered_from_1_and_a_queued_step_uses_none() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hi")
    step = model_step(state)
    assert step.attempts == []  # waiting in the queue uses no attempt

    first = handlers.assign(state, step.id, "w1", T0 + 1)

    assert first.number == 1
    assert first.worker_id == "w1"
    assert first.outcome == AttemptOutcome.RUNNING
    assert step.status == StepStatus.RUNNING

    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 2)
    assert step_status(step) == StepStatus.QUEUED
    assert len(step.attempts) == 1

    second = handlers.assign(state, step.id, "w2", T0 + 10)
    assert second.number == 2
    assert [a.number for a in step.attempts] == [1, 2]


def test_a_rate_limited_call_goes_back_unattempted_after_its_retry_after_or_a_backoff() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hi")
    step = model_step(state)
    waits = []
    for refusal, retry_after in enumerate([12.5, None, None, None, None, None, None, None]):
        now = T0 + 100 * refusal
        number = handlers.assign(state, step.id, "w1", now).number
        t = handlers.rate_limited(state, step.id, number, now, retry_after)
        assert t.ready == [step] and step.status == StepStatus.QUEUED
        assert step.attempts == []  # the refusal used no attempt
        assert step.not_before is not None
        waits.append(step.not_before - now)

    # the provider's Retry-After, then 1 s doubling per refusal, at most 60 s
    assert waits == [12.5, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert step.rate_limited == 8
    assert handlers.assign(state, step.id, "w1", T0 + 900).number == 1


# --- tool calls -------------------------------------------------------------------------------


def test_tool_calls_get_one_record_each_a_stable_key_and_a_step_by_kind() -> None:
    state, spec = new_state(), make_spec()

    asked = (
        ("c-a", "lookup", {"q": "weather"}),
        ("c-b", "upsert", {"key": "k", "value": 1}),
        ("c-c", "charge", {"amount": 5}),
    )

    t = ask_for_tools(state, spec, *asked)

    assert state.turn is not None
    calls = state.turn.tool_calls
    assert [c.model_call_id for c in calls] == ["c-a", "c-b", "c-c"]
    assert [c.name for c in calls] == ["lookup", "upsert", "charge"]
    assert calls[2].arguments == {"amount": 5}
    assert [c.kind for c in calls] == [ToolKind.READ, ToolKind.IDEMPOTENT_WRITE, ToolKind.WRITE]
    assert [c.idempotency_key for c in calls] == [f"{SID}/{c.id}" for c in calls]
    assert len({c.idempotency_key for c in calls}) == 3
    assert all(c.status == ToolCallStatus.PENDING for c in calls)

    steps = [step_for(state, cid) for cid in ("c-a", "c-b", "c-c")]
    assert [s.type for s in steps] == [
        StepType.CALL_TOOL,
        StepType.CALL_TOOL,
        StepType.CALL_SINGLE_ATTEMPT_TOOL,
    ]
    assert [s.queue for s in steps] == [
        "tool:helper/lookup",
        "tool:helper/upsert",
        "tool:helper/charge",
    ]
    assert [s.tool_call_id for s in steps] == [c.id for c in calls]
    assert steps[2].retry.max_attempts == 1
    assert steps[0].retry == Retry.of(LOOKUP.retry)
    assert [s.id for s in t.ready] == [s.id for s in steps]
    assert t.history == [AssistantItem(tool_calls=asks(*asked).tool_calls)]
    assert t.ended_turn is None
    assert state.turn.status == TurnStatus.RUNNING


def test_the_idempotency_key_stays_the_same_across_attempts_and_a_reload() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-b", "upsert", {"key": "k"}))
    key = call_for(state, "c-b").idempotency_key
    step = step_for(state, "c-b")
    handlers.assign(state, step.id, "w1", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)

    # Another node loads the same state from storage and runs attempt 2.
    reloaded = msgspec.json.decode(msgspec.json.encode(state), type=SessionState)
    attempt = handlers.assign(reloaded, step.id, "w2", T0 + 5)

    assert attempt.number == 2
    assert key == f"{SID}/{call_for(state, 'c-b').id}"
    assert call_for(reloaded, "c-b").idempotency_key == key


def test_an_unknown_tool_fails_at_once_naming_the_tool_and_gets_no_step() -> None:
    state, spec = new_state(), make_spec()

    t = ask_for_tools(state, spec, ("c-x", "teleport", {"to": "mars"}), ("c-a", "lookup", {}))

    call = call_for(state, "c-x")
    assert call.status == ToolCallStatus.FAILED
    assert call.error is not None and "'teleport'" in call.error
    assert call.step_id is None
    assert state.turn is not None
    assert all(s.tool_call_id != call.id for s in state.turn.steps)
    assert [s.id for s in t.ready] == [step_for(state, "c-a").id]


def test_a_response_of_only_unknown_tools_runs_the_model_again_with_the_error() -> None:
    state, spec = new_state(), make_spec()

    t = ask_for_tools(state, spec, ("c-x", "teleport", {}))

    [result] = [i for i in t.history if isinstance(i, ToolResultItem)]
    assert result.call_id == "c-x"
    assert result.status == ToolCallStatus.FAILED
    assert result.error is not None and "teleport" in result.error
    [step] = t.ready
    assert step.type == StepType.RUN_MODEL
    assert step is model_step(state) and step.status == StepStatus.QUEUED


def test_tool_results_reach_the_history_in_the_models_order_once_all_calls_ended() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(
        state,
        spec,
        ("c-a", "lookup", {"n": 1}),
        ("c-x", "teleport", {}),
        ("c-b", "lookup", {"n": 2}),
        ("c-c", "upsert", {"n": 3}),
    )
    steps_before = len(state.turn.steps) if state.turn else 0

    t_c = complete(state, spec, "c-c", ok("C"), now=T0 + 1)
    t_a = complete(state, spec, "c-a", ok("A"), now=T0 + 2)

    for t in (t_c, t_a):  # one call still runs: nothing for the model yet
        assert t.history == []
        assert t.ready == []
    assert state.turn is not None and len(state.turn.steps) == steps_before

    t_b = complete(state, spec, "c-b", ok("B"), now=T0 + 3)

    results = [i for i in t_b.history if isinstance(i, ToolResultItem)]
    assert t_b.history == results
    assert [r.call_id for r in results] == ["c-a", "c-x", "c-b", "c-c"]
    assert [r.result for r in results] == ["A", None, "B", "C"]
    assert [r.status for r in results] == [
        ToolCallStatus.SUCCEEDED,
        ToolCallStatus.FAILED,
        ToolCallStatus.SUCCEEDED,
        ToolCallStatus.SUCCEEDED,
    ]
    [step] = t_b.ready
    assert step.type == StepType.RUN_MODEL and step.queue == "model:helper"
    assert step is model_step(state)


def test_a_framework_state_in_the_response_is_stored_on_its_assistant_item() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "please use your tools")
    response = asks(("c-a", "lookup", {"n": 1}))
    response.state = {"run_state": {"schema": "1.0", "items": [1, 2]}}

    t = run_model(state, spec, response)

    [item] = t.history
    assert isinstance(item, AssistantItem)
    assert item.state == {"run_state": {"schema": "1.0", "items": [1, 2]}}
    assert item.model_dump(mode="json")["state"] == response.state
    # a plain model's item is written as before: no "state" key at all
    assert "state" not in AssistantItem(text="hi").model_dump(mode="json")


@pytest.mark.parametrize("tool", ["lookup", "upsert", "charge"])
def test_a_tool_error_records_failed_with_no_retry(tool: str) -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-1", tool, {"amount": 5}))

    t = complete(state, spec, "c-1", ToolOutcome(status="failed", error="card declined"))

    call = call_for(state, "c-1")
    step = step_for(state, "c-1")
    assert call.status == ToolCallStatus.FAILED
    assert call.error == "card declined"
    assert len(step.attempts) == 1
    assert step.status not in (StepStatus.QUEUED, StepStatus.RUNNING)
    assert t.history == [
        ToolResultItem(
            call_id="c-1", name=tool, status=ToolCallStatus.FAILED, error="card declined"
        )
    ]
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]


# --- failed attempts and retries ------------------------------------------------------------------


def test_a_failed_attempt_is_retried_with_backoff_up_to_max_attempts() -> None:
    state, spec = new_state(), make_spec()  # lookup: 3 attempts, backoff 1 s then 2 s
    ask_for_tools(state, spec, ("c-a", "lookup", {}))
    step, call = step_for(state, "c-a"), call_for(state, "c-a")

    handlers.assign(state, step.id, "w1", T0)
    assert call.status == ToolCallStatus.RUNNING
    t = handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 10)

    assert step.status == StepStatus.QUEUED
    assert step.not_before == T0 + 11
    assert call_status(call) == ToolCallStatus.PENDING
    assert [s.id for s in t.ready] == [step.id]
    assert t.history == []
    assert step.attempts[0].outcome == AttemptOutcome.FAILED
    assert step.attempts[0].error == crash()

    handlers.assign(state, step.id, "w2", T0 + 11)
    assert step.not_before is None
    handlers.fail_attempt(state, spec, step.id, 2, crash(), T0 + 20)
    assert step.status == StepStatus.QUEUED
    assert step.not_before == T0 + 22

    handlers.assign(state, step.id, "w3", T0 + 22)
    t = handlers.fail_attempt(state, spec, step.id, 3, crash("still broken"), T0 + 30)

    assert [a.number for a in step.attempts] == [1, 2, 3]
    assert step.status == StepStatus.FAILED
    assert call.status == ToolCallStatus.FAILED
    assert call.error == "still broken"
    assert all(s.id != step.id for s in t.ready)
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]


@pytest.mark.parametrize(
    ("tool", "attempts", "status"),
    [
        ("lookup", 3, ToolCallStatus.FAILED),
        ("upsert", 3, ToolCallStatus.OUTCOME_UNKNOWN),
        ("charge", 1, ToolCallStatus.OUTCOME_UNKNOWN),
    ],
)
def test_after_the_last_attempt_the_kind_decides_the_record(
    tool: str, attempts: int, status: ToolCallStatus
) -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-1", tool, {}))
    step = step_for(state, "c-1")

    t = fail_until_done(state, spec, step, T0)

    call = call_for(state, "c-1")
    assert len(step.attempts) == attempts
    assert step.status == StepStatus.FAILED
    assert step.error is not None
    assert step.error.attempt_progress == AttemptProgress.NOT_COMPLETED
    assert call.status == status
    [result] = [i for i in t.history if isinstance(i, ToolResultItem)]
    assert result.status == status  # what the model sees
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]  # the call never runs again


def test_no_retry_once_the_next_attempt_would_start_outside_the_window() -> None:
    patient = RetryPolicy(max_attempts=10, within_seconds=5, backoff_multiplier=1)
    spec = make_spec(ToolSpec(name="lookup", kind=ToolKind.READ, retry=patient))
    state = new_state()
    ask_for_tools(state, spec, ("c-a", "lookup", {}))
    step = step_for(state, "c-a")

    handlers.assign(state, step.id, "w1", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)  # retry at T0+2 < T0+5
    handlers.assign(state, step.id, "w2", T0 + 2)
    handlers.fail_attempt(state, spec, step.id, 2, crash(), T0 + 3)  # retry at T0+4 < T0+5
    assert step.status == StepStatus.QUEUED
    handlers.assign(state, step.id, "w3", T0 + 4)
    handlers.fail_attempt(state, spec, step.id, 3, crash(), T0 + 4.5)  # T0+5.5: too late

    assert len(step.attempts) == 3
    assert step_status(step) == StepStatus.FAILED
    assert call_for(state, "c-a").status == ToolCallStatus.FAILED


def test_backoff_grows_up_to_its_cap_and_zero_backoff_retries_at_once() -> None:
    capped = RetryPolicy(initial_backoff_seconds=10, backoff_multiplier=10, max_backoff_seconds=15)
    spec = make_spec(
        ToolSpec(name="lookup", kind=ToolKind.READ, retry=capped),
        ToolSpec(name="fast", kind=ToolKind.READ, retry=RetryPolicy(initial_backoff_seconds=0)),
    )
    state = new_state()
    ask_for_tools(state, spec, ("c-a", "lookup", {}), ("c-f", "fast", {}))
    slow, fast = step_for(state, "c-a"), step_for(state, "c-f")

    handlers.assign(state, slow.id, "w1", T0)
    handlers.fail_attempt(state, spec, slow.id, 1, crash(), T0 + 1)
    assert slow.not_before == T0 + 11
    handlers.assign(state, slow.id, "w1", T0 + 11)
    handlers.fail_attempt(state, spec, slow.id, 2, crash(), T0 + 12)
    assert slow.not_before == T0 + 27  # 100 s capped at 15 s

    handlers.assign(state, fast.id, "w2", T0)
    t = handlers.fail_attempt(state, spec, fast.id, 1, crash(), T0 + 1)
    assert fast.status == StepStatus.QUEUED
    assert fast.not_before is None
    assert [s.id for s in t.ready] == [fast.id]


def test_a_non_retryable_failure_fails_the_step_at_once() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-b", "upsert", {}))
    step = step_for(state, "c-b")
    handlers.assign(state, step.id, "w1", T0)

    handlers.fail_attempt(
        state,
        spec,
        step.id,
        1,
        AttemptError(message="bad arguments", retryable=False),
        T0 + 1,
    )

    assert len(step.attempts) == 1
    assert step.status == StepStatus.FAILED
    assert call_for(state, "c-b").status == ToolCallStatus.OUTCOME_UNKNOWN


def test_a_worker_reporting_not_started_for_a_handed_out_attempt_is_not_trusted() -> None:
    """The attempt reached a Worker, so the write may have run: outcome_unknown."""
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-c", "charge", {}))
    step = step_for(state, "c-c")
    handlers.assign(state, step.id, "w1", T0)

    error = AttemptError(message="lost", attempt_progress=AttemptProgress.NOT_STARTED)
    handlers.fail_attempt(state, spec, step.id, 1, error, T0 + 1)

    call = call_for(state, "c-c")
    assert call.status == ToolCallStatus.OUTCOME_UNKNOWN
    assert not (call.error or "").startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert step.error is not None
    assert step.error.attempt_progress == AttemptProgress.NOT_COMPLETED


@pytest.mark.parametrize("tool", ["lookup", "upsert", "charge"])
def test_a_tool_step_that_never_reached_a_worker_fails_as_safe_to_call_again(tool: str) -> None:
    # No public handler fails a queued Step yet (cancelling a turn will); the
    # failure route it will take is _fail_step on a Step with no attempt.
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-1", tool, {}))
    step = step_for(state, "c-1")
    handlers.assign(state, step.id, "w1", T0)
    handlers.hand_back(state, step.id, 1)  # handed back unstarted: no attempt left
    assert step.attempts == []

    t = Transition()
    handlers._fail_step(state, spec, step, AttemptError(message="cancelled"), T0 + 1, t)

    call = call_for(state, "c-1")
    assert call.status == ToolCallStatus.FAILED
    assert call.error is not None
    assert call.error.startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert step.error is not None
    assert step.error.attempt_progress == AttemptProgress.NOT_STARTED
    [result] = [i for i in t.history if isinstance(i, ToolResultItem)]
    assert result.error is not None and result.error.startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)


# --- hand back and recovery ---------------------------------------------------------------------


def test_hand_back_queues_the_step_again_without_using_an_attempt() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c-c", "charge", {"amount": 5}))  # a single-attempt write
    step, call = step_for(state, "c-c"), call_for(state, "c-c")
    handlers.assign(state, step.id, "w1", T0)

    t = handlers.hand_back(state, step.id, 1)

    assert step.status == StepStatus.QUEUED
    assert step.attempts == []
    assert step.handed_back == 1
    assert call.status == ToolCallStatus.PENDING
    assert [s.id for s in t.ready] == [step.id]
    assert t.history == []

    again = handlers.assign(state, step.id, "w2", T0 + 1)
    assert again.number == 1
    handlers.complete_tool(state, spec, step.id, 1, ok("charged"), T0 + 2)
    assert call_status(call) == ToolCallStatus.SUCCEEDED
    assert call.result == "charged"


def test_recover_fails_every_running_attempt_as_not_completed() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(
        state,
        spec,
        ("c-a", "lookup", {}),
        ("c-b", "upsert", {}),
        ("c-c", "charge", {}),
        ("c-q", "lookup", {}),
    )
    running = [step_for(state, cid) for cid in ("c-a", "c-b", "c-c")]
    for step in running:
        handlers.assign(state, step.id, "w1", T0)
    queued = step_for(state, "c-q")

    t = handlers.recover(state, spec, T0 + 5, "the server restarted")

    for step in running:
        [attempt] = step.attempts
        assert attempt.outcome == AttemptOutcome.FAILED
        assert attempt.ended_at == T0 + 5
        assert attempt.error == AttemptError(
            message="the server restarted", attempt_progress=AttemptProgress.NOT_COMPLETED
        )
    assert state.running_steps() == []
    assert call_for(state, "c-a").status == ToolCallStatus.PENDING  # a read runs again
    assert call_for(state, "c-b").status == ToolCallStatus.PENDING  # same key, runs again
    assert call_for(state, "c-c").status == ToolCallStatus.OUTCOME_UNKNOWN  # never again
    assert step_for(state, "c-c").status == StepStatus.FAILED
    assert {s.id for s in t.ready} == {running[0].id, running[1].id}
    assert queued.status == StepStatus.QUEUED and queued.attempts == []  # untouched


def test_recover_is_idempotent_and_leaves_idle_sessions_alone() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hi")
    step = model_step(state)
    handlers.assign(state, step.id, "w1", T0)

    handlers.recover(state, spec, T0 + 5, "restart")
    assert step.status == StepStatus.QUEUED
    assert state.turn is not None and state.turn.status == TurnStatus.RUNNING
    after_first = copy.deepcopy(state)

    t = handlers.recover(state, spec, T0 + 6, "restart again")

    assert state == after_first
    assert (t.history, t.ready, t.cancel, t.ended_turn) == ([], [], [], None)

    idle = new_state()
    before = copy.deepcopy(idle)
    t = handlers.recover(idle, spec, T0, "restart")
    assert idle == before
    assert t.ready == []


# --- a failed turn -----------------------------------------------------------------------------


def test_run_model_failing_for_good_without_tools_fails_the_turn_without_a_note() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hi")

    t = fail_until_done(state, spec, model_step(state), T0)

    assert t.ended_turn is not None
    assert t.ended_turn.status == TurnStatus.FAILED
    assert t.ended_turn.error is not None and "RunModel" in t.ended_turn.error
    assert len(t.ended_turn.steps[0].attempts) == 3
    assert t.history == []
    assert state.status == SessionStatus.IDLE and state.turn is None


def test_run_model_failing_for_good_after_tools_ran_leaves_a_note_naming_them() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(
        state,
        spec,
        ("c-a", "lookup", {"q": "balance"}),
        ("c-c", "charge", {"amount": 5}),
        ("c-x", "teleport", {}),
        ("c-b", "upsert", {"key": "k"}),
    )
    complete(state, spec, "c-a", ok({"balance": 10}))
    fail_until_done(state, spec, step_for(state, "c-c"), T0)  # outcome_unknown
    never_ran = step_for(state, "c-b")  # reaches no Worker, then fails as not run
    handlers._fail_step(state, spec, never_ran, AttemptError(message="gone"), T0, Transition())
    handlers.receive_message(state, spec, "are you there?", None, T0 + 1)

    t = fail_until_done(state, spec, model_step(state), T0 + 2)

    assert t.ended_turn is not None
    assert t.ended_turn.number == 1
    assert t.ended_turn.status == TurnStatus.FAILED
    notes = [i for i in t.history if isinstance(i, NoteItem)]
    assert len(notes) == 1
    note = notes[0].text
    assert 'lookup({"q": "balance"})' in note and "succeeded" in note
    assert 'charge({"amount": 5})' in note and "outcome_unknown" in note
    assert "teleport" not in note  # unknown: never ran
    assert "upsert" not in note  # never reached a Worker
    # the note comes before the next turn's message, which starts turn 2
    assert t.history == [notes[0], UserItem(text="are you there?")]
    assert state.turn is not None and state.turn.number == 2


# --- late and duplicate inputs are refused and change nothing ------------------------------------


def _running_model(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    send(state, spec, "hi")
    step = model_step(state)
    handlers.assign(state, step.id, "w1", T0)
    return lambda: handlers.complete_model(state, spec, step.id, 2, answer("x"), T0 + 1)


def _model_already_completed(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-a", "lookup", {}))
    assert state.turn is not None
    step = state.turn.steps[0]
    assert step.type == StepType.RUN_MODEL and step.status == StepStatus.SUCCEEDED
    return lambda: handlers.complete_model(state, spec, step.id, 1, answer("again"), T0 + 1)


def _tool_already_completed(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-a", "lookup", {}), ("c-b", "lookup", {}))
    complete(state, spec, "c-a", ok("first"))
    step = step_for(state, "c-a")
    return lambda: handlers.complete_tool(state, spec, step.id, 1, ok("second"), T0 + 1)


def _tool_late_after_retry_started(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-b", "upsert", {}))
    step = step_for(state, "c-b")
    handlers.assign(state, step.id, "w1", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)
    handlers.assign(state, step.id, "w2", T0 + 2)
    return lambda: handlers.complete_tool(state, spec, step.id, 1, ok("late"), T0 + 3)


def _tool_late_while_waiting_for_backoff(
    state: SessionState, spec: AgentSpec
) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-b", "upsert", {}))
    step = step_for(state, "c-b")
    handlers.assign(state, step.id, "w1", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)
    return lambda: handlers.complete_tool(state, spec, step.id, 1, ok("late"), T0 + 3)


def _write_late_after_outcome_unknown(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-c", "charge", {}), ("c-a", "lookup", {}))
    step = step_for(state, "c-c")
    handlers.assign(state, step.id, "w1", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)
    assert call_for(state, "c-c").status == ToolCallStatus.OUTCOME_UNKNOWN
    return lambda: handlers.complete_tool(state, spec, step.id, 1, ok("charged"), T0 + 2)


def _fail_after_completion(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-a", "lookup", {}), ("c-b", "lookup", {}))
    complete(state, spec, "c-a", ok("done"))
    step = step_for(state, "c-a")
    return lambda: handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)


def _hand_back_after_completion(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    ask_for_tools(state, spec, ("c-a", "lookup", {}), ("c-b", "lookup", {}))
    complete(state, spec, "c-a", ok("done"))
    step = step_for(state, "c-a")
    return lambda: handlers.hand_back(state, step.id, 1)


def _tool_result_for_a_model_step(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    send(state, spec, "hi")
    step = model_step(state)
    handlers.assign(state, step.id, "w1", T0)
    return lambda: handlers.complete_tool(state, spec, step.id, 1, ok("?"), T0 + 1)


def _assign_a_running_step(state: SessionState, spec: AgentSpec) -> Callable[[], object]:
    send(state, spec, "hi")
    step = model_step(state)
    handlers.assign(state, step.id, "w1", T0)
    return lambda: handlers.assign(state, step.id, "w2", T0 + 1)


@pytest.mark.parametrize(
    "setup",
    [
        _running_model,
        _model_already_completed,
        _tool_already_completed,
        _tool_late_after_retry_started,
        _tool_late_while_waiting_for_backoff,
        _write_late_after_outcome_unknown,
        _fail_after_completion,
        _hand_back_after_completion,
        _tool_result_for_a_model_step,
        _assign_a_running_step,
    ],
)
def test_a_late_or_duplicate_input_is_refused_and_changes_nothing(
    setup: Callable[[SessionState, AgentSpec], Callable[[], object]],
) -> None:
    state, spec = new_state(), make_spec()
    late = setup(state, spec)
    before = copy.deepcopy(state)

    with pytest.raises(Conflict):
        late()

    assert state == before


def test_a_result_for_a_turn_that_already_ended_is_refused_and_changes_nothing() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "first")
    first = model_step(state)
    handlers.assign(state, first.id, "w1", T0)
    handlers.complete_model(state, spec, first.id, 1, answer("one"), T0 + 1)
    send(state, spec, "second", now=T0 + 2)  # turn 2 runs now
    before = copy.deepcopy(state)

    with pytest.raises(NotFound):
        handlers.complete_model(state, spec, first.id, 1, answer("late"), T0 + 3)

    assert state == before


# --- compaction --------------------------------------------------------------------------------


def commit(state: SessionState, history: list[Item], t: Transition) -> Transition:
    """What the shell does with a transition's history: append it and count it."""
    history += t.history
    state.history_length += len(t.history)
    return t


def compact(state: SessionState, spec: AgentSpec, history: list[Item], text: str) -> Transition:
    """Hand the queued CompactContext Step out (its handout would carry
    ``state.to_compact(history)``) and complete it with the summary ``text``."""
    assert state.turn is not None
    [step] = [s for s in state.turn.steps if s.type == StepType.COMPACT_CONTEXT]
    attempt = handlers.assign(state, step.id, "w-model", T0)
    summary = Summary(text=text)
    return commit(
        state,
        history,
        handlers.complete_summary(state, spec, step.id, attempt.number, summary, T0),
    )


def test_a_compaction_summarizes_what_came_before_the_turn_and_the_model_sees_the_turn() -> None:
    state, spec = new_state(), make_spec()
    spec.compact_threshold_chars = 100
    history: list[Item] = []
    commit(state, history, send(state, spec, "first " + "x" * 100))
    assert state.turn is not None
    assert [s.type for s in state.turn.steps] == [StepType.RUN_MODEL]  # nothing to compact yet
    commit(state, history, run_model(state, spec, answer("one")))
    commit(state, history, send(state, spec, "second"))
    assert state.turn is not None
    assert [s.type for s in state.turn.steps] == [StepType.COMPACT_CONTEXT]
    assert state.to_compact(history) == history[:2]  # not the message the model must answer

    compact(state, spec, history, "they said first")

    summary = SummaryItem(text="they said first")
    assert history[3] == summary  # stored once, in the order it was made
    assert state.context(history) == [summary, UserItem(text="second")]
    assert [s.type for s in state.turn.steps] == [StepType.COMPACT_CONTEXT, StepType.RUN_MODEL]
    commit(state, history, run_model(state, spec, answer("two")))
    commit(state, history, send(state, spec, "third"))
    # the next compaction summarizes the summary and the turn after it
    assert state.to_compact(history) == [summary, UserItem(text="second"), history[4]]
    assert state.context(history)[-1] == UserItem(text="third")


def test_a_compaction_within_a_turn_keeps_its_tool_calls_and_results() -> None:
    state, spec = new_state(), make_spec()
    spec.compact_threshold_chars = 100
    history: list[Item] = []
    commit(state, history, send(state, spec, "first " + "x" * 100))
    commit(state, history, run_model(state, spec, answer("one")))
    commit(state, history, send(state, spec, "look it up"))
    compact(state, spec, history, "s1")
    commit(state, history, run_model(state, spec, asks(("c-a", "lookup", {"key": "k" * 80}))))
    commit(state, history, complete(state, spec, "c-a", ok("v" * 80)))

    # past the threshold again, but only the turn's own items are left: no compaction
    assert state.context_chars > 100
    assert state.turn is not None and state.turn.steps[-1].type == StepType.RUN_MODEL
    assert state.context(history) == [SummaryItem(text="s1"), history[2], *history[4:]]
    assert isinstance(history[-1], ToolResultItem)


# --- every attempt on record, times, and retries after a lost Worker -----------------------

EXPORT = ToolSpec(
    name="export",
    kind=ToolKind.TASK,
    retry=RetryPolicy(max_attempts=2, initial_backoff_seconds=0),
    poll_interval_seconds=1.0,
)


def test_every_attempt_of_every_poll_stays_on_record_and_retries_count_per_poll() -> None:
    spec = make_spec(EXPORT)
    state = new_state()
    ask_for_tools(state, spec, ("c1", "export", {}))
    start = step_for(state, "c1")
    handlers.assign(state, start.id, "w", T0)
    handlers.complete_tool(state, spec, start.id, 1, ok("handle-7"), T0)
    poll = step_for(state, "c1")
    assert poll.type == StepType.POLL_TOOL_TASK
    outcomes: list[tuple[int, AttemptOutcome]] = []
    for n, now in ((1, T0 + 1), (2, T0 + 2), (3, T0 + 3)):  # poll 1 fails once, then pending
        attempt = handlers.assign(state, poll.id, "w", now)
        assert attempt.number == n  # numbered on across polls: each attempt id is unique
        if n == 1:
            handlers.fail_attempt(state, spec, poll.id, n, crash(), now)
        elif n == 2:
            handlers.complete_tool(state, spec, poll.id, n, ToolOutcome(status="pending"), now)
        else:  # poll 2 fails: its own first failure, retried (2 attempts per poll)
            handlers.fail_attempt(state, spec, poll.id, n, crash(), now)
    assert poll.status == StepStatus.QUEUED
    attempt = handlers.assign(state, poll.id, "w", T0 + 4)
    handlers.complete_tool(state, spec, poll.id, attempt.number, ok("exported"), T0 + 4)
    outcomes = [(a.number, a.outcome) for a in poll.attempts]
    assert outcomes == [
        (1, AttemptOutcome.FAILED),
        (2, AttemptOutcome.SUCCEEDED),
        (3, AttemptOutcome.FAILED),
        (4, AttemptOutcome.SUCCEEDED),
    ]
    assert call_for(state, "c1").status == ToolCallStatus.SUCCEEDED
    assert poll.ended_at == T0 + 4


def test_a_succeeded_step_records_when_it_ended() -> None:
    spec = make_spec()
    state = new_state()
    ask_for_tools(state, spec, ("c1", "lookup", {"key": "k"}))
    assert state.turn is not None
    model = state.turn.steps[0]
    assert model.status == StepStatus.SUCCEEDED and model.ended_at == T0
    step = step_for(state, "c1")
    handlers.assign(state, step.id, "w", T0 + 1)
    handlers.complete_tool(state, spec, step.id, 1, ok("v"), T0 + 2)
    assert step.ended_at == T0 + 2


def test_an_attempt_the_server_lost_retries_at_once_and_a_failing_one_backs_off() -> None:
    spec = make_spec(ToolSpec(name="lookup", kind=ToolKind.READ))  # 1 s initial backoff
    state = new_state()
    ask_for_tools(state, spec, ("c1", "lookup", {"key": "k"}))
    step = step_for(state, "c1")
    handlers.assign(state, step.id, "w", T0)
    handlers.fail_attempt(state, spec, step.id, 1, crash("Worker gone"), T0, backoff=False)
    assert step.status == StepStatus.QUEUED and step.not_before is None
    handlers.assign(state, step.id, "w", T0 + 1)
    handlers.fail_attempt(state, spec, step.id, 2, crash("ValueError: x"), T0 + 1)
    assert step.not_before == T0 + 1 + spec.tools[0].retry.backoff(2)


# --- live text: a failed model attempt's partial output is void ---------------------------


def test_a_failed_or_cancelled_model_attempt_tells_subscribers_to_discard_its_text() -> None:
    state, spec = new_state(), make_spec()
    send(state, spec, "hello")
    step = model_step(state)
    first = handlers.assign(state, step.id, "w1", T0)

    retried = handlers.fail_attempt(state, spec, step.id, first.number, crash(), T0 + 1)
    assert retried.events == [
        {"type": "model.discard", "step_id": step.id, "attempt_id": f"{SID}/{step.id}/1"}
    ]
    assert retried.ready == [step]  # the retry streams after the discard
    second = handlers.assign(state, step.id, "w2", T0 + 2)
    cancelled = handlers.cancel_turn(state, spec, T0 + 3, "the user left")
    discards = [e for e in cancelled.events if e["type"] == "model.discard"]
    assert discards == [
        {"type": "model.discard", "step_id": step.id, "attempt_id": f"{SID}/{step.id}/2"}
    ]
    assert second.number == 2


def test_a_tool_attempt_that_fails_has_no_text_to_discard() -> None:
    state, spec = new_state(), make_spec()
    ask_for_tools(state, spec, ("c1", "lookup", {"q": "x"}))
    step = step_for(state, "c1")
    attempt = handlers.assign(state, step.id, "w-tool", T0)
    t = handlers.fail_attempt(state, spec, step.id, attempt.number, crash(), T0 + 1)
    assert not [e for e in t.events if e["type"] == "model.discard"]

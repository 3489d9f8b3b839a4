"""Messages mid-turn: what a user message does while a turn of its session runs
(``on_busy``: enqueue, reject, interrupt, steer), as the pure handlers decide it."""

from __future__ import annotations

import msgspec
import pytest

import dex
from dex.errors import Conflict
from dex.models import Scripted
from dex.server.engine import handlers
from dex.server.engine.handlers import Transition
from dex.server.engine.state import (
    SendOutcome,
    Sent,
    SessionState,
    SessionStatus,
    ToolCall,
    TurnStatus,
    attempt_id,
)
from dex.wire import (
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AgentSpec,
    Approval,
    AssistantItem,
    Item,
    NoteItem,
    OnBusy,
    StepStatus,
    StepType,
    ToolCallStatus,
    ToolResultItem,
    ToolSpec,
    UserItem,
)
from tests.unit.test_handlers import (
    CHARGE,
    LOOKUP,
    SID,
    T0,
    answer,
    asks,
    call_for,
    complete,
    crash,
    make_spec,
    model_step,
    new_state,
    ok,
    run_model,
    step_for,
)


def say(
    state: SessionState, spec: AgentSpec, text: str, on_busy: OnBusy | None = None
) -> Transition:
    t, number = handlers.receive_message(state, spec, text, None, T0 + 1, on_busy)
    assert t.sent is not None and number == t.sent.turn
    return t


def users(items: list[Item]) -> list[str]:
    return [i.text for i in items if isinstance(i, UserItem)]


def running_turn(spec: AgentSpec) -> tuple[SessionState, Transition]:
    """A session whose turn 1 runs its model call (handed to a Worker)."""
    state = new_state()
    t = say(state, spec, "first")
    handlers.assign(state, model_step(state).id, "w-model", T0)
    return state, t


def test_a_message_to_an_idle_session_starts_its_turn_whatever_the_policy() -> None:
    policies: list[OnBusy | None] = ["enqueue", "reject", "interrupt", "steer", None]
    for policy in policies:
        state = new_state()
        t = say(state, make_spec(), "hello", policy)
        assert t.sent == Sent(turn=1, outcome=SendOutcome.STARTED)
        assert state.turn is not None and state.turn.number == 1


def test_enqueue_is_the_default_a_message_waits_for_the_running_turn() -> None:
    spec = make_spec()
    state, _ = running_turn(spec)

    t = say(state, spec, "second")

    assert t.sent == Sent(turn=2, outcome=SendOutcome.QUEUED)
    assert [m.text for m in state.queued] == ["second"]
    assert t.history == [] and t.cancel == []


def test_reject_refuses_the_message_naming_the_turn_and_changes_nothing() -> None:
    spec = make_spec()
    state, _ = running_turn(spec)
    before = msgspec.json.encode(state)

    with pytest.raises(Conflict) as refused:
        say(state, spec, "second", "reject")

    assert refused.value.details == {"session_id": SID, "turn": 1}
    assert msgspec.json.encode(state) == before


def test_the_agents_policy_applies_unless_the_message_gives_one() -> None:
    spec = make_spec()
    spec.on_busy = "reject"
    state, _ = running_turn(spec)

    with pytest.raises(Conflict):
        say(state, spec, "second")
    t = say(state, spec, "second", "enqueue")

    assert t.sent == Sent(turn=2, outcome=SendOutcome.QUEUED)


def test_interrupt_cancels_the_turn_as_cancel_does_and_starts_the_new_one_in_one_transition() -> (
    None
):
    spec = make_spec()
    state = new_state()
    say(state, spec, "pay and look")
    run_model(state, spec, asks(("c1", "charge", {"amount": 5}), ("c2", "lookup", {})))
    charge = step_for(state, "c1")
    attempt = handlers.assign(state, charge.id, "w-tool", T0)  # the write runs; lookup queued
    say(state, spec, "queued before", "enqueue")  # turn 2 waits

    t = say(state, spec, "stop, do this instead", "interrupt")

    assert t.sent == Sent(turn=3, outcome=SendOutcome.INTERRUPTED, interrupted=1)
    assert t.ended_turn is not None and t.ended_turn.number == 1
    assert t.ended_turn.status == TurnStatus.CANCELLED
    assert t.cancel == [attempt_id(SID, charge.id, attempt.number)]  # its Worker is told
    paid, looked = call_for_ended(t, "c1"), call_for_ended(t, "c2")
    assert paid.status == ToolCallStatus.OUTCOME_UNKNOWN  # it may have run
    assert looked.status == ToolCallStatus.FAILED
    assert (looked.error or "").startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    # the message queued before it has its turn first: turns run in the order of their numbers
    assert state.turn is not None and state.turn.number == 2
    assert [m.number for m in state.queued] == [3]
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]
    assert users(t.history) == ["queued before"]
    assert isinstance(t.history[0], NoteItem)  # the cancelled turn's calls that may have run
    types = [e["type"] for e in t.events]
    assert types.index("turn.cancelled") < types.index("turn.started")


def call_for_ended(t: Transition, model_call_id: str) -> ToolCall:
    assert t.ended_turn is not None
    [call] = [c for c in t.ended_turn.tool_calls if c.model_call_id == model_call_id]
    return call


def test_an_interrupting_message_s_turn_follows_those_queued_before_it_in_order() -> None:
    spec = make_spec()
    state, _ = running_turn(spec)
    say(state, spec, "second")
    say(state, spec, "third", "interrupt")
    assert state.turn is not None and state.turn.number == 2  # turn 1 cancelled

    t = run_model(state, spec, answer("done with the second"))

    assert t.ended_turn is not None and t.ended_turn.number == 2
    assert state.turn is not None and state.turn.number == 3
    assert users(t.history) == ["third"]


def test_steer_does_not_interrupt_a_running_model_call_the_next_call_sees_the_message() -> None:
    spec = make_spec()
    state, _ = running_turn(spec)
    step = model_step(state)

    t = say(state, spec, "also in euros", "steer")

    assert t.sent == Sent(turn=1, outcome=SendOutcome.STEERED)
    assert state.messages_received == 1  # no turn of its own: turn 1 answers it
    assert t.cancel == [] and t.ready == [] and t.history == []
    assert step.status == StepStatus.RUNNING
    assert state.turn is not None and state.turn.steered == ["also in euros"]

    # the running call's answer stands; the turn goes on for the steered message
    done = handlers.complete_model(state, spec, step.id, 1, answer("42 dollars"), T0 + 2)

    assert done.ended_turn is None
    assert [type(i) for i in done.history] == [AssistantItem, UserItem]
    assert users(done.history) == ["also in euros"]
    assert [s.type for s in done.ready] == [StepType.RUN_MODEL]
    assert state.turn.steered == []

    last = run_model(state, spec, answer("39 euros"))
    assert last.ended_turn is not None and last.ended_turn.status == TurnStatus.COMPLETED


def test_steer_into_a_queued_model_call_joins_the_history_at_once() -> None:
    spec = make_spec()
    state = new_state()
    say(state, spec, "first")  # its RunModel waits in the queue

    t = say(state, spec, "and briefly", "steer")

    assert users(t.history) == ["and briefly"]
    assert state.turn is not None and state.turn.steered == []
    final = run_model(state, spec, answer("ok"))
    assert final.ended_turn is not None  # the call saw both: one answer ends the turn


def test_steer_while_tools_run_joins_after_their_results() -> None:
    spec = make_spec()
    state = new_state()
    say(state, spec, "look it up")
    run_model(state, spec, asks(("c1", "lookup", {})))

    say(state, spec, "the other one", "steer")
    t = complete(state, spec, "c1", ok("found"))

    assert [type(i) for i in t.history] == [ToolResultItem, UserItem]
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]


def test_steer_while_the_turn_waits_for_an_approval_keeps_it_waiting() -> None:
    spec = make_spec(LOOKUP, ToolSpec(name="charge", approval=Approval.ALWAYS))
    state = new_state()
    say(state, spec, "pay")
    run_model(state, spec, asks(("c1", "charge", {"amount": 5})))
    wait = step_for(state, "c1")

    t = say(state, spec, "only 5 dollars", "steer")

    assert wait.type == StepType.AWAIT_TOOL_APPROVAL and wait.status == StepStatus.WAITING
    assert t.ready == [] and state.status == SessionStatus.RUNNING
    assert state.person_waits() == [wait]
    handlers.record_input(state, {"kind": "approve", "call_id": call_for(state, "c1").id}, T0)
    handlers.apply_input(state, spec, T0)
    after = complete(state, spec, "c1", ok("paid"))
    assert users(after.history) == ["only 5 dollars"]


def test_steer_after_the_turn_ended_starts_a_turn() -> None:
    spec = make_spec()
    state, _ = running_turn(spec)
    handlers.complete_model(state, spec, model_step(state).id, 1, answer("done"), T0)

    t = say(state, spec, "one more thing", "steer")

    assert t.sent == Sent(turn=2, outcome=SendOutcome.STARTED)


def test_messages_steered_into_a_turn_that_fails_stay_in_the_history() -> None:
    spec = make_spec(CHARGE)
    state, _ = running_turn(spec)
    say(state, spec, "hurry", "steer")
    step = model_step(state)

    t = handlers.fail_attempt(state, spec, step.id, 1, crash(), T0 + 1)
    assert t.ended_turn is None  # retried: still pending
    while state.turn is not None:
        attempt = handlers.assign(state, step.id, "w", T0 + 2)
        t = handlers.fail_attempt(state, spec, step.id, attempt.number, crash(), T0 + 3)

    assert t.ended_turn is not None and t.ended_turn.status == TurnStatus.FAILED
    assert users(t.history) == ["hurry"]


def test_dex_agent_declares_its_on_busy_and_leaves_the_default_out() -> None:
    """The Worker registers the agent's policy; the default is left out of the spec, so a
    Worker that keeps it registers with a server that does not know the field."""
    steering = dex.Agent(name="a", model=Scripted(lambda _: answer("x")), on_busy="steer")
    default = dex.Agent(name="a", model=Scripted(lambda _: answer("x")))

    assert steering.spec().on_busy == "steer"
    assert steering.spec().model_dump()["on_busy"] == "steer"
    assert default.spec().on_busy == "enqueue"
    assert "on_busy" not in default.spec().model_dump(mode="json")

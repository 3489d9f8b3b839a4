"""Prices, usage and budgets in the pure engine: what a model call costs, that its usage
counts once when its result commits, and the budget wait a turn enters when its session's
budget is used up (and leaves once, when the budget is raised)."""

from __future__ import annotations

import msgspec
import pytest

from dex.errors import NotFound
from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.budget import (
    DEFAULT_PRICES,
    FREE,
    Budget,
    Price,
    Prices,
    TenantBudget,
    model_name,
)
from dex.server.engine.budget import Usage as UsageTotals
from dex.server.engine.state import AttemptError, SessionState, Step, TurnStatus
from dex.server.engine.turn import hold_for_tenant
from dex.server.flow import TenantBudgets, day_of
from dex.wire import (
    AgentSpec,
    AttemptProgress,
    Item,
    ModelResponse,
    StepStatus,
    StepType,
    Summary,
    ToolOutcome,
    Usage,
)
from tests.unit.test_handlers import T0, asks, commit, make_spec, new_state, send

SONNET = Prices().of("claude-sonnet-4-5")


def used(input_tokens: int, output_tokens: int, text: str = "done") -> ModelResponse:
    return ModelResponse(
        text=text, usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens)
    )


def queued_model(state: SessionState) -> Step:
    assert state.turn is not None
    [step] = [
        s for s in state.turn.steps if s.type == StepType.RUN_MODEL and s.status.value == "queued"
    ]
    return step


def answer_with(
    state: SessionState, spec: AgentSpec, response: ModelResponse, price: Price = SONNET
) -> handlers.Transition:
    step = queued_model(state)
    attempt = handlers.assign(state, step.id, "w", T0)
    return handlers.complete_model(state, spec, step.id, attempt.number, response, T0, price=price)


def budget_waits(state: SessionState) -> list[Step]:
    assert state.turn is not None
    return [s for s in state.turn.steps if s.type == StepType.AWAIT_BUDGET]


# --- prices ------------------------------------------------------------------------------


def test_a_call_costs_its_tokens_at_its_model_s_price() -> None:
    assert Price(input=3.0, output=15.0) == SONNET
    assert SONNET.cost(1_000_000, 0) == pytest.approx(3.0)
    assert SONNET.cost(2_000, 1_000) == pytest.approx(0.006 + 0.015)


def test_a_dated_model_name_takes_the_price_of_its_longest_known_prefix() -> None:
    prices = Prices()
    assert prices.of("claude-sonnet-4-5-20250929") == DEFAULT_PRICES["claude-sonnet-4-5"]
    assert prices.of("gpt-4o-mini-2024-07-18") == DEFAULT_PRICES["gpt-4o-mini"]
    assert prices.of("gpt-4o-2024-08-06") == DEFAULT_PRICES["gpt-4o"]
    assert prices.of("gpt-4o") == DEFAULT_PRICES["gpt-4o"]


def test_an_unknown_model_costs_nothing() -> None:
    assert Prices().of("my-local-llama") == FREE
    assert Prices().of("gpt-4ox") == FREE  # a prefix counts only up to a dash


def test_an_override_replaces_a_shipped_price_and_adds_models() -> None:
    prices = Prices({**DEFAULT_PRICES, "gpt-4o": Price(input=1, output=2), "mine": FREE})
    assert prices.of("gpt-4o-2024-08-06") == Price(input=1, output=2)
    assert prices.of("claude-haiku-4-5") == DEFAULT_PRICES["claude-haiku-4-5"]


def test_the_model_is_named_by_the_agent_s_spec() -> None:
    assert model_name({"provider": "anthropic", "model": "claude-opus-4-1"}) == "claude-opus-4-1"
    assert model_name({"provider": "scripted", "name": "demo"}) == "demo"
    assert model_name({}) == ""


# --- usage --------------------------------------------------------------------------------


def test_a_committed_call_adds_its_usage_to_its_turn_and_its_session_once() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    t = answer_with(state, spec, used(2_000, 1_000))
    assert (state.usage.input_tokens, state.usage.output_tokens) == (2_000, 1_000)
    assert state.usage.cost_usd == pytest.approx(0.021)
    assert t.ended_turn is not None
    assert t.ended_turn.usage == state.usage
    [step] = t.ended_turn.steps
    assert step.usage == {"input_tokens": 2_000, "output_tokens": 1_000}
    assert step.cost_usd == pytest.approx(0.021)
    send(state, spec, "again")
    answer_with(state, spec, used(100, 10))
    assert (state.usage.tokens, state.usage.calls) == (3_110, 2)


def test_a_negative_count_reported_by_a_worker_counts_as_none() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    answer_with(state, spec, used(-5_000, 10))
    assert (state.usage.input_tokens, state.usage.output_tokens) == (0, 10)
    assert state.usage.cost_usd == pytest.approx(SONNET.cost(0, 10))


def test_a_failed_attempt_counts_nothing_and_its_retry_counts_once() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    step = queued_model(state)
    attempt = handlers.assign(state, step.id, "w", T0)
    error = AttemptError(message="worker died", attempt_progress=AttemptProgress.NOT_COMPLETED)
    handlers.fail_attempt(state, spec, step.id, attempt.number, error, T0, backoff=False)
    assert state.usage.calls == 0
    answer_with(state, spec, used(500, 50))
    assert (state.usage.tokens, state.usage.calls) == (550, 1)


def test_a_late_second_result_of_the_same_call_is_refused_and_not_counted() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    step = queued_model(state)
    attempt = handlers.assign(state, step.id, "w", T0)
    handlers.complete_model(state, spec, step.id, attempt.number, used(10, 1), T0, price=SONNET)
    with pytest.raises(NotFound):  # the turn ended: the Step is no longer current
        handlers.complete_model(state, spec, step.id, attempt.number, used(10, 1), T0)
    assert state.usage.tokens == 11


def test_a_summary_s_usage_counts_too() -> None:
    spec = make_spec()
    spec.compact_threshold_chars = 10
    state = new_state()
    history: list[Item] = []
    commit(state, history, send(state, spec, "a long enough first message"))
    commit(state, history, answer_with(state, spec, used(100, 10)))
    commit(state, history, send(state, spec, "second message, also long"))
    assert state.turn is not None
    [compact] = [s for s in state.turn.steps if s.type == StepType.COMPACT_CONTEXT]
    attempt = handlers.assign(state, compact.id, "w", T0)
    summary = Summary(text="sum", usage=Usage(input_tokens=40, output_tokens=4))
    handlers.complete_summary(state, spec, compact.id, attempt.number, summary, T0, price=SONNET)
    assert (state.usage.tokens, state.usage.calls) == (154, 2)
    assert state.turn.usage.tokens == 44
    queued_model(state)  # the model call after the summary


def test_usage_and_budget_survive_storage() -> None:
    spec = make_spec()
    state = new_state()
    state.budget = Budget(max_tokens=10_000, max_cost_usd=2.5)
    send(state, spec, "hi")
    answer_with(state, spec, used(7, 3))
    stored = records.session_record(state)
    again = msgspec.json.decode(stored.state.replace('"format":2,', ""), type=SessionState)
    assert again.usage == state.usage
    assert again.budget == Budget(max_tokens=10_000, max_cost_usd=2.5)
    old = msgspec.json.decode(
        b'{"id":"s","agent":"a","created_at":1.0}', type=SessionState
    )  # written before budgets: no usage, no budget
    assert old.usage.tokens == 0 and old.budget is None


# --- the budget wait ----------------------------------------------------------------------


def over_budget_turn(spec: AgentSpec, budget: Budget) -> SessionState:
    """A session whose first turn used 1,100 tokens and asked for a tool; the tool's result
    brings the turn to its next model call."""
    state = new_state()
    state.budget = budget
    send(state, spec, "hi")
    response = asks(("m1", "lookup", {}))
    response.usage = Usage(input_tokens=1_000, output_tokens=100)
    answer_with(state, spec, response)
    assert state.turn is not None
    [tool] = [s for s in state.turn.steps if s.type == StepType.CALL_TOOL]
    attempt = handlers.assign(state, tool.id, "w", T0)
    handlers.complete_tool(
        state, spec, tool.id, attempt.number, ToolOutcome(status="succeeded", result=1), T0
    )
    return state


def test_a_turn_over_its_budget_waits_instead_of_calling_the_model() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    [wait] = budget_waits(state)
    assert wait.status == StepStatus.WAITING
    assert wait.wait is not None and wait.wait.reason == "1100 tokens used of a budget of 1000"
    assert state.queued_steps() == []  # no model call queued
    assert state.fleet_status().value == "waiting"
    assert state.waiting_since() == T0


def test_under_its_budget_a_turn_calls_the_model() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_101))
    assert budget_waits(state) == []
    queued_model(state)


def test_a_cost_budget_counts_dollars() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_cost_usd=0.004))  # 1,000 in + 100 out: $0.0045
    [wait] = budget_waits(state)
    assert wait.wait is not None and wait.wait.reason == "$0.004500 used of a budget of $0.004"


def test_a_turn_starts_in_its_budget_wait_when_the_budget_is_used_up() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    answer_with(state, spec, used(60, 40))
    state.budget = Budget(max_tokens=100)
    t = send(state, spec, "more")
    assert [e["wait"] for e in t.events if e["type"] == "wait.started"] == ["AwaitBudget"]
    assert t.ready == []
    [wait] = budget_waits(state)
    assert wait.status == StepStatus.WAITING


def test_raising_the_budget_resumes_the_turn_once() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    t = handlers.set_budget(state, spec, Budget(max_tokens=5_000), "ops", T0 + 5)
    [wait] = budget_waits(state)
    assert wait.status == StepStatus.SUCCEEDED
    assert wait.wait is not None and wait.wait.resolution == {
        "kind": "budget",
        "budget": {"max_tokens": 5_000, "max_cost_usd": None},
        "by": "ops",
    }
    [step] = t.ready
    assert step.type == StepType.RUN_MODEL and step is queued_model(state)
    assert [e["type"] for e in t.events] == ["budget.changed", "wait.ended"]
    again = handlers.set_budget(state, spec, Budget(max_tokens=9_000), None, T0 + 6)
    assert again.ready == []  # nothing waits any more: no second model call
    assert state.fleet_status().value == "running"


def test_a_raise_that_is_still_used_up_keeps_the_turn_waiting() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    t = handlers.set_budget(state, spec, Budget(max_tokens=1_050), None, T0 + 5)
    assert t.ready == []
    [wait] = budget_waits(state)
    assert wait.status == StepStatus.WAITING
    assert wait.wait is not None and wait.wait.reason == "1100 tokens used of a budget of 1050"


def test_removing_the_budget_resumes_the_turn() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    t = handlers.set_budget(state, spec, None, None, T0 + 5)
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]
    assert state.budget is None


def test_a_turn_in_its_budget_wait_can_be_cancelled() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    [wait] = budget_waits(state)
    t = handlers.cancel_turn(state, spec, T0 + 5, "too expensive")
    assert t.ended_turn is not None and t.ended_turn.status == TurnStatus.CANCELLED
    assert wait.status == StepStatus.CANCELLED
    assert handlers.set_budget(state, spec, None, None, T0 + 6).ready == []


def test_a_session_without_a_budget_never_waits() -> None:
    spec = make_spec()
    state = new_state()
    send(state, spec, "hi")
    answer_with(state, spec, used(10**9, 10**9, text=""))
    assert state.turn is None  # the answer ended the turn
    send(state, spec, "and again")
    queued_model(state)


# --- a tenant's budget ----------------------------------------------------------------------


def test_a_tenant_budget_says_which_limit_of_which_period_is_used_up() -> None:
    budget = TenantBudget(max_tokens_per_day=100, max_cost_usd_per_month=2.0)
    day, month = UsageTotals(input_tokens=60), UsageTotals(input_tokens=60, cost_usd=1.0)
    assert budget.reached("acme", day, month) is None
    day.output_tokens = 40
    assert budget.reached("acme", day, month) == "tenant acme: 100 tokens used today of 100"
    month.cost_usd = 2.5
    day.output_tokens = 0
    assert budget.reached("acme", day, month) == "tenant acme: $2.500000 used this month of $2"
    assert TenantBudget().reached("acme", day, month) is None


def test_a_model_call_held_for_its_tenant_becomes_a_budget_wait_on_the_tenant() -> None:
    spec = make_spec()
    state = new_state()
    state.tenant = "acme"
    t = send(state, spec, "hi")
    [model] = t.ready
    hold_for_tenant(state, t, {"max_tokens_per_day": 10}, "tenant acme: 10 tokens", T0)
    assert t.ready == []
    assert state.turn is not None and [s.type for s in state.turn.steps] == [StepType.AWAIT_BUDGET]
    [wait] = budget_waits(state)
    assert wait.id == model.id  # the Step it replaced was never stored
    assert wait.wait is not None and wait.wait.tenant == "acme"
    [started] = [e for e in t.events if e["type"] == "wait.started"]
    assert started["tenant"] == "acme" and started["budget"] == {"max_tokens_per_day": 10}

    still = handlers.recheck_budget(state, spec, "tenant acme: 20 tokens", None, T0 + 1)
    assert still.ready == [] and wait.wait.reason == "tenant acme: 20 tokens"
    t = handlers.recheck_budget(state, spec, None, None, T0 + 2)
    assert [s.type for s in t.ready] == [StepType.RUN_MODEL]
    assert wait.wait.resolution == {"kind": "budget", "tenant": "acme", "by": None}
    assert handlers.recheck_budget(state, spec, None, None, T0 + 3).ready == []  # once


def test_a_retried_model_call_is_not_held_for_its_tenant() -> None:
    spec = make_spec()
    state = new_state()
    state.tenant = "acme"
    send(state, spec, "hi")
    step = queued_model(state)
    attempt = handlers.assign(state, step.id, "w", T0)
    error = AttemptError(message="overloaded", attempt_progress=AttemptProgress.NOT_STARTED)
    t = handlers.fail_attempt(state, spec, step.id, attempt.number, error, T0 + 1)
    assert t.ready == [step]
    hold_for_tenant(state, t, {}, "tenant acme: used up", T0 + 1)
    assert t.ready == [step] and budget_waits(state) == []


def test_the_session_s_own_budget_wins_the_reason_of_a_recheck() -> None:
    spec = make_spec()
    state = over_budget_turn(spec, Budget(max_tokens=1_000))
    state.tenant = "acme"
    t = handlers.recheck_budget(state, spec, "tenant acme: used up", None, T0 + 5)
    [wait] = budget_waits(state)
    assert t.ready == [] and wait.wait is not None
    assert (wait.wait.reason, wait.wait.tenant) == ("1100 tokens used of a budget of 1000", None)


def test_the_tenants_day_changes_exactly_at_midnight_utc_either_way() -> None:
    tenants = TenantBudgets(store=None, now=lambda: 0.0)  # type: ignore[arg-type]
    midnight = 1_781_049_600.0  # 2026-06-10 00:00 UTC
    assert tenants.day(midnight - 0.001) == "2026-06-09"
    assert tenants.day(midnight) == "2026-06-10"
    assert tenants.day(midnight + 86_399.9) == "2026-06-10"
    assert tenants.day(midnight + 86_400) == "2026-06-11"
    assert tenants.day(midnight - 40 * 86_400) == "2026-05-01"  # a clock set back
    assert all(tenants.day(t) == day_of(t) for t in (0.0, 1e9, midnight + 12_345.6))

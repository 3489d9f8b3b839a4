"""Session budgets through the HTTP API and the Worker protocol: usage in the views and
the metrics, a budget set at creation and changed at run time, the budget wait in the
snapshot, the inbox and the turn's ``waiting_for``, and the one model call that follows a
raise. Bad input is a 4xx with the JSON error shape and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dex.wire import AgentSpec, ModelResponse, ModelToolCall, ToolKind, ToolSpec, Usage
from tests.integration.conftest import Api, FakeWorker, connect_fake_worker
from tests.integration.test_api import _metrics, assert_error, everything, tool_done

PRICED = AgentSpec(
    name="priced",
    model={"provider": "anthropic", "model": "claude-sonnet-4-5-20250929"},
    tools=[ToolSpec(name="lookup", kind=ToolKind.READ)],
)
"""Priced as claude-sonnet-4-5: $3 per million input tokens, $15 per million output."""


@pytest.fixture
def worker(api: Api) -> Iterator[FakeWorker]:
    with connect_fake_worker(api, agents=[PRICED]) as fake:
        yield fake


def create(api: Api, session_id: str, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": PRICED.name, "session_id": session_id}
    if budget is not None:
        body["budget"] = budget
    response = api.http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def answer(
    worker: FakeWorker, session_id: str, tokens: tuple[int, int], *, tool: bool = False
) -> None:
    """Hand out the session's next RunModel Step and answer it with ``tokens`` used (and a
    tool call, with ``tool``)."""
    step = worker.step(session_id=session_id, step_type="RunModel")
    calls = [ModelToolCall(id="m1", name="lookup", arguments={})] if tool else []
    response = ModelResponse(
        text="" if tool else "done",
        tool_calls=calls,
        usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1]),
    )
    assert worker.done(step["attempt_id"], response.model_dump(mode="json"))["ok"] is True


def run_tool(worker: FakeWorker, session_id: str) -> None:
    step = worker.step(session_id=session_id, tool="lookup")
    assert worker.done(step["attempt_id"], tool_done(1))["ok"] is True


def put_budget(api: Api, session_id: str, **body: Any) -> Any:
    return api.http.put(f"/v1/sessions/{session_id}/budget", json=body)


def test_usage_shows_in_the_turn_the_session_the_list_and_the_metrics(
    api: Api, worker: FakeWorker
) -> None:
    created = create(api, "s1")
    assert created["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    api.send("s1", "hi")
    answer(worker, "s1", (2_000, 1_000))
    assert api.turn("s1", 1, wait=10)["status"] == "completed"

    snapshot = api.snapshot("s1")
    used = {"input_tokens": 2_000, "output_tokens": 1_000, "cost_usd": pytest.approx(0.021)}
    assert snapshot["session"]["usage"] == used
    assert snapshot["session"]["budget"] is None
    [row] = api.all_sessions()
    assert row["usage"] == used
    [step] = api.turn("s1", 1)["steps"]
    assert step["usage"] == {"input_tokens": 2_000, "output_tokens": 1_000}
    assert step["cost_usd"] == pytest.approx(0.021)

    m = _metrics(api)
    model = 'model="claude-sonnet-4-5-20250929"'
    assert m[f'dex_model_tokens_total{{agent="priced",direction="input",{model}}}'] == 2_000
    assert m[f'dex_model_tokens_total{{agent="priced",direction="output",{model}}}'] == 1_000
    assert m[f'dex_model_cost_usd_total{{agent="priced",{model}}}'] == pytest.approx(0.021)


def test_a_turn_over_its_budget_waits_and_a_raise_resumes_it_once(
    api: Api, worker: FakeWorker
) -> None:
    created = create(api, "s1", {"max_tokens": 1_000})
    assert created["usage"]["input_tokens"] == 0
    api.send("s1", "hi")
    answer(worker, "s1", (1_000, 100), tool=True)
    run_tool(worker, "s1")

    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "waiting"
    [waiting] = turn["waiting_for"]
    assert waiting["kind"] == "budget"
    assert waiting["reason"] == "1100 tokens used of a budget of 1000"
    assert waiting["tenant"] is None  # the session's own budget, not its tenant's
    assert waiting["budget"] == {"max_tokens": 1_000, "max_cost_usd": None}
    assert waiting["usage"]["input_tokens"] == 1_000
    snapshot = api.snapshot("s1")
    assert snapshot["session"]["status"] == "waiting"
    assert snapshot["session"]["waiting_since"] is not None
    [wait] = snapshot["waits"]
    assert wait["type"] == "AwaitBudget" and wait["reason"] == waiting["reason"]
    assert snapshot["waiting"] == []  # no model call is queued
    inbox = api.http.get("/v1/inbox").json()["items"]
    assert [(i["session_id"], i["kind"]) for i in inbox] == [("s1", "budget")]

    still = put_budget(api, "s1", max_tokens=1_050)  # raised, but still used up
    assert still.status_code == 200, still.text
    assert still.json()["status"] == "waiting"
    assert api.snapshot("s1")["waits"][0]["reason"] == "1100 tokens used of a budget of 1050"

    raised = put_budget(api, "s1", max_tokens=5_000, by="ops")
    assert raised.json() == {
        "session_id": "s1",
        "budget": {"max_tokens": 5_000, "max_cost_usd": None},
        "usage": {"input_tokens": 1_000, "output_tokens": 100, "cost_usd": pytest.approx(0.0045)},
        "status": "running",
    }
    put_budget(api, "s1", max_tokens=6_000)  # raised again: nothing waits any more
    answer(worker, "s1", (10, 1))
    assert api.turn("s1", 1, wait=10)["status"] == "completed"
    steps = [s["type"] for s in api.turn("s1", 1)["steps"]]
    assert steps == ["RunModel", "CallTool", "AwaitBudget", "RunModel"]
    assert api.http.get("/v1/inbox").json()["items"] == []


def test_a_cost_budget_and_its_removal(api: Api, worker: FakeWorker) -> None:
    create(api, "s1", {"max_cost_usd": 0.01})
    api.send("s1", "hi")
    answer(worker, "s1", (1_000, 1_000))  # $0.018
    api.send("s1", "more")
    turn = api.turn("s1", 2, wait=10)
    assert turn["status"] == "waiting"
    assert turn["waiting_for"][0]["reason"] == "$0.018000 used of a budget of $0.01"

    removed = api.http.delete("/v1/sessions/s1/budget", params={"by": "ops"})
    assert removed.status_code == 200, removed.text
    assert removed.json()["budget"] is None
    answer(worker, "s1", (1, 1))
    assert api.turn("s1", 2, wait=10)["status"] == "completed"


def test_a_turn_in_its_budget_wait_can_be_cancelled(api: Api, worker: FakeWorker) -> None:
    create(api, "s1", {"max_tokens": 10})
    api.send("s1", "hi")
    answer(worker, "s1", (10, 0))
    api.send("s1", "more")
    assert api.turn("s1", 2, wait=10)["status"] == "waiting"
    cancelled = api.http.post("/v1/sessions/s1/cancel", json={"reason": "too dear"})
    assert cancelled.status_code == 200, cancelled.text
    turn = api.turn("s1", 2)
    assert turn["status"] == "cancelled"
    assert [s["status"] for s in turn["steps"]] == ["cancelled"]
    put_budget(api, "s1", max_tokens=100)  # nothing to resume: no model call
    snapshot = api.snapshot("s1")
    assert snapshot["session"]["status"] == "idle"
    assert snapshot["current_turn"] is None and snapshot["waiting"] == []


@pytest.mark.parametrize(
    "budget",
    [
        {},
        {"max_tokens": 0},
        {"max_tokens": -5},
        {"max_tokens": "many"},
        {"max_cost_usd": 0},
        {"max_cost_usd": -1.0},
        {"max_cost_usd": "NaN"},
        {"max_tokens": 10, "max_dollars": 5},
    ],
)
def test_a_bad_budget_is_422_and_changes_nothing(
    api: Api, worker: FakeWorker, budget: dict[str, Any]
) -> None:
    create(api, "s1", {"max_tokens": 100})
    before = everything(api)
    assert_error(put_budget(api, "s1", **budget), 422)
    response = api.http.post(
        "/v1/sessions", json={"agent": PRICED.name, "session_id": "s2", "budget": budget}
    )
    assert_error(response, 422)
    assert everything(api) == before


def test_the_budget_of_an_unknown_session_is_404(api: Api, worker: FakeWorker) -> None:
    assert_error(put_budget(api, "nobody", max_tokens=5), 404)
    assert_error(api.http.delete("/v1/sessions/nobody/budget"), 404)

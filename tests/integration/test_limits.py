"""Model limits and tool concurrency keys, through the API and the Worker protocol: a Step
a limit holds stays queued with no attempt, says what it waits for, and goes out once
admitted; a provider's refusal closes its group until its Retry-After."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from dex.testing import wait_until
from dex.wire import AgentSpec, ModelResponse, ModelToolCall, ToolKind, ToolSpec, Usage
from tests.integration.conftest import (
    AGENT,
    Api,
    FakeWorker,
    connect_fake_worker,
    make_api_app,
)
from tests.integration.test_api import _metrics, tool_done

GROUP = "scripted/test"  # AGENT's model: the provider and the model's name


def limits(api: Api) -> dict[str, dict[str, Any]]:
    response = api.http.get("/admin/limits")
    assert response.status_code == 200
    return {g["group"]: g for g in response.json()["groups"]}


def put(api: Api, group: str, **limit: Any) -> dict[str, Any]:
    response = api.http.put(f"/admin/limits/{group}", json=limit)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def attempts(api: Api, session_id: str) -> list[list[int]]:
    """Each Step's attempt numbers in the session's current turn."""
    turn = api.snapshot(session_id)["current_turn"]
    return [[a["number"] for a in step["attempts"]] for step in turn["steps"]]


def answered(tokens: int = 0) -> dict[str, Any]:
    usage = Usage(input_tokens=tokens, output_tokens=0)
    return ModelResponse(text="ok", usage=usage).model_dump(mode="json")


def test_a_step_held_by_calls_at_once_waits_with_no_attempt_then_runs_once(
    api: Api, worker: FakeWorker
) -> None:
    put(api, GROUP, concurrency=1)
    api.create("a")
    api.create("b")
    api.send("a", "first")
    first = worker.step(session_id="a")
    api.send("b", "second")

    def held() -> bool:
        waiting = api.snapshot("b")["waiting"]
        return bool(waiting) and waiting[0]["limit"] is not None

    wait_until(held, 10, 0.02, "b's model call held by the limit")
    waiting = api.snapshot("b")["waiting"][0]
    assert waiting["limit"] == {"key": GROUP, "limit": "concurrency", "until": None}
    assert waiting["waiting_for"] == f"the limit of calls at once of {GROUP}"
    assert attempts(api, "b") == [[]]  # queued, no attempt used
    assert limits(api)[GROUP] | {"lowered_to": 1} == {
        "group": GROUP,
        "limit": {"concurrency": 1, "rpm": None, "tpm": None},
        "source": "api",
        "running": 1,
        "waiting": 1,
        "lowered_to": 1,
    }
    with pytest.raises(TimeoutError):
        worker.step(timeout=0.3, session_id="b")
    page = api.http.get("/ui/sessions/b").text  # the console says it too
    assert f"Step 1.1 is queued, waiting for the limit of calls at once of {GROUP}." in page
    metrics = _metrics(api)
    assert metrics[f'dex_limit_waiting{{key="{GROUP}"}}'] == 1
    assert metrics[f'dex_limit_running{{key="{GROUP}"}}'] == 1

    assert worker.done(first["attempt_id"], answered())["ok"]
    second = worker.step(session_id="b")
    assert second["attempt"] == 1
    assert worker.done(second["attempt_id"], answered())["ok"]
    turn = api.turn("b", 1, wait=10)
    assert turn["status"] == "completed"
    assert [[a["number"] for a in step["attempts"]] for step in turn["steps"]] == [[1]]
    assert limits(api)[GROUP]["running"] == 0


def test_a_refusal_closes_the_group_until_retry_after_using_no_attempt(
    api: Api, worker: FakeWorker
) -> None:
    api.create("a")
    api.create("b")
    api.send("a", "first")
    refused = worker.step(session_id="a")
    worker.send(
        {
            "t": "back",
            "attempt_id": refused["attempt_id"],
            "reason": "rate_limited",
            "retry_after": 1,
        }
    )
    assert worker.ack(refused["attempt_id"])["ok"]
    sent = time.time()
    api.send("b", "second")
    waiting = api.snapshot("b")["waiting"]
    assert waiting[0]["limit"]["limit"] == "retry_after"
    assert waiting[0]["limit"]["until"] == pytest.approx(sent + 1, abs=0.5)
    assert limits(api)[GROUP]["lowered_to"] == 0.5

    # once Retry-After passed they go out, one at a time (one ran when it was refused),
    # neither having used an attempt for the refusal
    handed = []
    for _ in range(2):
        step = worker.expect("step", timeout=10)
        handed.append((step["session_id"], step["attempt"]))
        assert worker.done(step["attempt_id"], answered())["ok"]
    assert time.time() >= sent + 0.9
    assert sorted(handed) == [("a", 1), ("b", 1)]
    assert limits(api)[GROUP]["lowered_to"] == pytest.approx(0.7)


BOOKER = AgentSpec(
    name="booker",
    model={"provider": "scripted", "name": "booker"},
    tools=[
        ToolSpec(
            name="book",
            kind=ToolKind.IDEMPOTENT_WRITE,
            concurrency_key="{customer}",
            concurrency_limit=1,
        )
    ],
)


@pytest.fixture
def booker(api: Api) -> Iterator[FakeWorker]:
    with connect_fake_worker(api, "w-booker", agents=[BOOKER]) as fake:
        yield fake


def book(api: Api, worker: FakeWorker, session_id: str, customer: str) -> None:
    """Start a turn whose model asks to book for ``customer``."""
    api.create(session_id, agent=BOOKER.name)
    api.send(session_id, f"book for {customer}")
    step = worker.step(session_id=session_id, step_type="RunModel")
    call = ModelToolCall(id="c1", name="book", arguments={"customer": customer})
    result = ModelResponse(tool_calls=[call]).model_dump(mode="json")
    assert worker.done(step["attempt_id"], result)["ok"]


def test_a_tool_runs_one_call_at_a_time_per_key(api: Api, booker: FakeWorker) -> None:
    book(api, booker, "alice-1", "alice")
    first = booker.step(session_id="alice-1", step_type="CallTool")
    book(api, booker, "alice-2", "alice")
    book(api, booker, "bob-1", "bob")
    booker.step(session_id="bob-1", step_type="CallTool")  # another key: at once
    waiting = api.snapshot("alice-2")["waiting"]
    assert waiting[0]["limit"] == {
        "key": "tool:booker/book=alice",
        "limit": "concurrency",
        "until": None,
    }
    with pytest.raises(TimeoutError):
        booker.step(timeout=0.3, session_id="alice-2", step_type="CallTool")
    assert booker.done(first["attempt_id"], tool_done("booked"))["ok"]
    second = booker.step(session_id="alice-2", step_type="CallTool")
    assert second["attempt"] == 1


def test_limits_set_at_run_time_outlive_the_node_and_clearing_them_restores_the_config(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with TestClient(make_api_app(data)) as client:
        api = Api(client, client.app)
        assert put(api, "openai/gpt-5", rpm=500, tpm=30_000)["groups"][0]["source"] == "api"
    with TestClient(make_api_app(data)) as client:
        api = Api(client, client.app)
        assert limits(api)["openai/gpt-5"]["limit"] == {
            "concurrency": None,
            "rpm": 500,
            "tpm": 30000,
        }
        response = client.delete("/admin/limits/openai/gpt-5")
        assert response.status_code == 200
        assert "openai/gpt-5" not in limits(api)


@pytest.mark.parametrize(
    "body",
    [{"concurrency": 0}, {"rpm": -5}, {"tokens": 10}, {"tpm": "lots"}, []],
)
def test_bad_limits_are_refused_and_change_nothing(api: Api, body: Any) -> None:
    put(api, GROUP, concurrency=2)
    response = api.http.put(f"/admin/limits/{GROUP}", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert limits(api)[GROUP]["limit"]["concurrency"] == 2


def test_a_tenant_with_a_thousand_queued_turns_delays_anothers_by_one_hand_out_round(
    api: Api,
) -> None:
    api.register(AGENT)
    for n in range(1000):
        api.http.post(
            "/v1/sessions", json={"agent": AGENT.name, "session_id": f"a{n}", "tenant": "a"}
        )
        api.send(f"a{n}", "hello")
    with connect_fake_worker(api, "w-one", capacity=1) as worker:
        running = worker.step()  # the one Worker runs one call at a time
        api.http.post("/v1/sessions", json={"agent": AGENT.name, "session_id": "b", "tenant": "b"})
        api.send("b", "hello")
        # the next hand-out round (one call: the Worker's capacity) is b's
        assert worker.done(running["attempt_id"], answered())["ok"]
        after = worker.step()
        assert (after["session_id"], after["attempt"]) == ("b", 1)
        assert api.snapshot("a999")["waiting"][0]["waiting_for"] == "a free Worker"

"""Messages mid-turn through the API (``on_busy``: docs/mid-turn.md): a message sent while a
turn runs is queued, refused, interrupts the turn or is steered into it, as the send or
its agent says; the answer says which, and a send again with its message_id answers the
same and changes nothing."""

from __future__ import annotations

from typing import Any

from dex.wire import AgentSpec, ModelResponse, ModelToolCall
from tests.integration.conftest import AGENT, Api, FakeWorker, connect_fake_worker


def model_done(text: str = "", tool_calls: list[ModelToolCall] | None = None) -> dict[str, Any]:
    return ModelResponse(text=text, tool_calls=tool_calls or []).model_dump(mode="json")


def post(api: Api, session_id: str, text: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    response = api.http.post(f"/v1/sessions/{session_id}/messages", json={"text": text, **extra})
    body: dict[str, Any] = response.json()
    return response.status_code, body


def test_a_message_to_an_idle_session_started_its_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    sent = api.send("s1", "hello", on_busy="reject")
    assert (sent["turn"], sent["outcome"], sent["interrupted"]) == (1, "started", None)


def test_enqueue_is_the_default(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "first")
    worker.step(session_id="s1")
    sent = api.send("s1", "second")
    assert (sent["turn"], sent["outcome"]) == (2, "queued")


def test_reject_is_a_409_naming_the_running_turn_and_changes_nothing(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "first")
    worker.step(session_id="s1")
    before = api.snapshot("s1")

    status, body = post(api, "s1", "second", on_busy="reject", message_id="m-2")

    assert status == 409
    assert body["error"]["code"] == "conflict"
    assert body["error"]["details"] == {"session_id": "s1", "turn": 1}
    after = api.snapshot("s1")
    assert after["session"] == before["session"] and after["history"] == before["history"]
    # not remembered: sent again once the turn has ended, it is decided again
    assert post(api, "s1", "second", on_busy="reject", message_id="m-2")[0] == 409


def test_an_unknown_policy_is_a_422(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    status, body = post(api, "s1", "hi", on_busy="shout")
    assert status == 422 and body["error"]["code"] == "invalid_request"


def test_interrupt_cancels_the_running_turn_and_starts_the_message_s(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "charge")
    model = worker.step(session_id="s1")
    calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
    worker.done(model["attempt_id"], model_done(tool_calls=calls))
    charge = worker.step(session_id="s1", tool="charge")  # the write runs

    sent = api.send("s1", "stop, look it up", on_busy="interrupt", message_id="m-2")

    assert (sent["turn"], sent["outcome"], sent["interrupted"]) == (2, "interrupted", 1)
    assert sent["created"] is True
    assert worker.heartbeat(charge["attempt_id"]) == {charge["attempt_id"]: "stop"}
    old = api.turn("s1", 1)
    assert old["status"] == "cancelled" and "interrupted by message 2" in old["error"]
    assert [c["status"] for c in old["tool_calls"]] == ["outcome_unknown"]  # it may have run
    new = worker.step(session_id="s1", step_id="2.1")
    assert new["history"][-1] == {"type": "user", "text": "stop, look it up"}

    again = api.send("s1", "stop, look it up", on_busy="interrupt", message_id="m-2")
    assert again["created"] is False
    assert (again["turn"], again["outcome"], again["interrupted"]) == (2, "interrupted", 1)
    assert api.snapshot("s1")["session"]["messages_received"] == 2  # applied once

    worker.done(new["attempt_id"], model_done("looked"))
    assert api.turn("s1", 2, wait=10)["status"] == "completed"


def test_steer_joins_the_running_turn_without_interrupting_its_model_call(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "what is my balance?")
    first = worker.step(session_id="s1")

    sent = api.send("s1", "in euros", on_busy="steer", message_id="m-2")

    assert (sent["turn"], sent["outcome"], sent["status"]) == (1, "steered", "running")
    assert worker.heartbeat(first["attempt_id"]) == {first["attempt_id"]: "ok"}
    pending = api.snapshot("s1")
    assert pending["current_turn"]["steered"] == ["in euros"]
    assert pending["session"]["messages_received"] == 1
    again = api.send("s1", "in euros", on_busy="steer", message_id="m-2")
    assert (again["created"], again["turn"], again["outcome"]) == (False, 1, "steered")

    worker.done(first["attempt_id"], model_done("42 dollars"))  # its result stands
    second = worker.step(session_id="s1", step_id="1.2")
    assert second["history"] == [
        {"type": "user", "text": "what is my balance?"},
        {"type": "assistant", "text": "42 dollars", "tool_calls": []},
        {"type": "user", "text": "in euros"},
    ]
    worker.done(second["attempt_id"], model_done("39 euros"))
    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed" and turn["text"] == "39 euros"
    history = api.snapshot("s1")["history"]
    assert [i for i in history if i["type"] == "user"] == [
        {"type": "user", "text": "what is my balance?"},
        {"type": "user", "text": "in euros"},
    ]


def test_steer_with_wait_waits_for_the_running_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    first = worker.step(session_id="s1")
    api.send("s1", "and goodbye", on_busy="steer", message_id="m-2")
    worker.done(first["attempt_id"], model_done("hi"))
    second = worker.step(session_id="s1", step_id="1.2")
    worker.done(second["attempt_id"], model_done("hi and bye"))

    # the same send, waiting: the turn it was steered into answers it
    again = api.send("s1", "and goodbye", on_busy="steer", message_id="m-2", wait_seconds=10)
    assert (again["turn"], again["status"], again["text"]) == (1, "completed", "hi and bye")


def test_the_agent_s_policy_applies_unless_the_send_gives_one(api: Api) -> None:
    steering = AgentSpec(**{**AGENT.model_dump(), "on_busy": "steer"})
    with connect_fake_worker(api, agents=[steering]) as worker:
        assert api.http.get("/v1/agents").json()["agents"][0]["on_busy"] == "steer"
        api.create("s1")
        api.send("s1", "first")
        worker.step(session_id="s1")
        assert api.send("s1", "more")["outcome"] == "steered"
        assert api.send("s1", "later", on_busy="enqueue")["outcome"] == "queued"

"""The HTTP API and the Worker WebSocket, driven in process through Starlette's TestClient."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import pytest
from starlette.testclient import TestClient
from starlette.types import Message, Scope
from starlette.websockets import WebSocketDisconnect

from dex.server.api.errors import BodyLimit
from dex.testing import wait_until
from dex.wire import (
    ModelResponse,
    ModelToolCall,
    RecoveryError,
    ToolOutcome,
    UserItem,
)
from dex.wire.protocol import StepMessage
from tests.integration.conftest import (
    MAX_BODY,
    Api,
    FakeWorker,
    connect_fake_worker,
    fastapi_of,
    make_api_app,
)

# --- helpers ---------------------------------------------------------------------------------


class Response(Protocol):
    """What ``assert_error`` reads of a TestClient response: an ``httpx2.Response`` with the
    Starlette we run, an ``httpx.Response`` with older ones, so it names neither."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def json(self) -> Any: ...


def assert_error(response: Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is our JSON error shape: {"error": {"code", "message", "details"?}}."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) <= {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    result: dict[str, Any] = error
    return result


def everything(api: Api) -> dict[str, Any]:
    """All that the API shows: every session's row and snapshot."""
    rows = api.all_sessions()
    return {"rows": rows, "snapshots": {r["id"]: api.snapshot(r["id"]) for r in rows}}


def model_done(text: str = "", tool_calls: list[ModelToolCall] | None = None) -> dict[str, Any]:
    return ModelResponse(text=text, tool_calls=tool_calls or []).model_dump(mode="json")


def tool_done(result: Any) -> dict[str, Any]:
    return ToolOutcome(status="succeeded", result=result).model_dump(mode="json")


# --- operations ------------------------------------------------------------------------------


def test_healthz(api: Api) -> None:
    response = api.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_when_ready(api: Api) -> None:
    response = api.http.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


def test_readyz_is_503_before_the_node_started(tmp_path: Path) -> None:
    client = TestClient(make_api_app(tmp_path / "data"))  # not entered: no lifespan ran
    try:
        response = client.get("/readyz")
    finally:
        client.close()
    assert response.status_code == 503
    assert response.json()["status"] != "ready"


def test_the_root_redirects_to_the_web_console(api: Api) -> None:
    response = api.http.get("/", follow_redirects=False)
    assert response.is_redirect and response.headers["location"] == "/ui"
    page = api.http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_openapi_lists_the_session_routes(api: Api) -> None:
    response = api.http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"post", "get"} <= set(paths["/v1/sessions"])
    assert "get" in paths["/v1/sessions/{session_id}"]
    assert "post" in paths["/v1/sessions/{session_id}/messages"]
    assert "get" in paths["/v1/sessions/{session_id}/turns/{number}"]


def _metrics(api: Api) -> dict[str, float]:
    """Every sample of ``/metrics`` (``name{labels}`` -> value), after checking the text
    is Prometheus': each sample belongs to a family with a TYPE and a HELP line."""
    response = api.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    values: dict[str, float] = {}
    types: dict[str, str] = {}
    helps: set[str] = set()
    for line in response.text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            assert parts[1] in ("TYPE", "HELP"), line
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped")
                types[parts[2]] = parts[3]
            else:
                assert len(parts) == 4 and parts[3].strip(), f"no help text: {line}"
                helps.add(parts[2])
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)  # every sample line is "name value"
    for sample in values:
        base = sample.split("{")[0]
        family = next(
            (f for f in types if base == f or (base.startswith(f + "_") and types[f] != "gauge")),
            None,
        )
        assert family is not None, f"{sample} has no TYPE"
        assert family in helps, f"{family} has no HELP"
    return values


def test_metrics_is_prometheus_text(api_with_agent: Api) -> None:
    before = _metrics(api_with_agent)
    assert before["dex_workers_connected"] == 0
    assert before['dex_node_role{role="active"}'] == 1
    api_with_agent.create("m1")
    after = _metrics(api_with_agent)
    assert after["dex_store_commits_total"] > before["dex_store_commits_total"]
    # the writer spent time on that commit (wall time: never less than nothing)
    assert after["dex_store_busy_seconds_total"] > before["dex_store_busy_seconds_total"]


def test_metrics_count_attempts_turns_and_unknown_outcomes(
    api_with_agent: Api, worker: FakeWorker
) -> None:
    api = api_with_agent
    api.create("s1")
    api.send("s1", "charge")
    model = worker.step(session_id="s1")
    calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
    worker.done(model["attempt_id"], model_done(tool_calls=calls))
    charge = worker.step(session_id="s1", tool="charge")
    error = {"message": "boom", "attempt_progress": "NOT_COMPLETED"}
    worker.send({"t": "fail", "attempt_id": charge["attempt_id"], "error": error})
    assert worker.ack(charge["attempt_id"])["ok"] is True
    final = worker.step(session_id="s1", step_type="RunModel")
    worker.done(final["attempt_id"], model_done("not sure"))
    assert api.turn("s1", 1, wait=10)["status"] == "completed"
    m = _metrics(api)
    run_model = 'dex_attempts_total{attempt_progress="",outcome="succeeded",step_type="RunModel"}'
    assert m[run_model] == 2
    failed = (
        'dex_attempts_total{attempt_progress="NOT_COMPLETED",outcome="failed",'
        'step_type="CallSingleAttemptTool"}'
    )
    assert m[failed] == 1
    assert m['dex_turns_total{status="completed"}'] == 1
    assert m["dex_turn_seconds_count"] == 1
    assert m["dex_outcome_unknown_total"] == 1
    assert m['dex_tool_calls_total{kind="write",status="outcome_unknown"}'] == 1
    assert m['dex_queue_wait_seconds_count{queue="model:echo"}'] == 2


def test_unknown_route_and_wrong_method_are_json_errors(api: Api) -> None:
    assert_error(api.http.get("/v1/nothing-here"), 404, "not_found")
    assert_error(api.http.delete("/v1/sessions"), 405, "method_not_allowed")


# --- creating and reading sessions --------------------------------------------------------------


def test_create_session(api_with_agent: Api) -> None:
    response = api_with_agent.http.post("/v1/sessions", json={"agent": "echo", "session_id": "s1"})
    assert response.status_code == 201
    body = response.json()
    assert body["id"] == "s1" and body["agent"] == "echo" and body["status"] == "idle"
    generated = api_with_agent.create()
    assert generated["id"] and generated["id"] != "s1"
    assert {r["id"] for r in api_with_agent.all_sessions()} == {"s1", generated["id"]}
    snapshot = api_with_agent.snapshot("s1")
    assert snapshot["session"]["status"] == "idle"
    assert snapshot["history"] == [] and snapshot["current_turn"] is None


def test_generated_session_ids_sort_in_the_order_the_sessions_were_made(
    api_with_agent: Api,
) -> None:
    """``s_``, the creation's millisecond and 48 random bits, in hex: a session made in a
    later millisecond has a later id (new sessions go to the end of the id index)."""
    ids = []
    for _ in range(4):
        _next_millisecond()
        ids.append(api_with_agent.create()["id"])
    assert all(re.fullmatch(r"s_[0-9a-f]{24}", i) for i in ids), ids
    assert sorted(ids) == ids and len(set(ids)) == 4


def _next_millisecond() -> None:
    now = time.time_ns() // 1_000_000
    wait_until(lambda: time.time_ns() // 1_000_000 > now, 1, 0, "the next millisecond")


def test_create_session_for_an_unknown_agent_is_404(api_with_agent: Api) -> None:
    before = everything(api_with_agent)
    response = api_with_agent.http.post(
        "/v1/sessions", json={"agent": "nobody", "session_id": "s1"}
    )
    assert "nobody" in assert_error(response, 404, "not_found")["message"]
    assert everything(api_with_agent) == before
    assert_error(api_with_agent.http.get("/v1/sessions/s1"), 404)


def test_duplicate_session_id_is_409_and_changes_nothing(api_with_agent: Api) -> None:
    api_with_agent.create("dup")
    api_with_agent.send("dup", "hello")
    before = everything(api_with_agent)
    response = api_with_agent.http.post("/v1/sessions", json={"agent": "echo", "session_id": "dup"})
    assert_error(response, 409, "conflict")
    assert everything(api_with_agent) == before


@pytest.mark.parametrize("bad", ["has space", "slash/inside", "ünïcode", "semi;colon", "x" * 129])
def test_bad_session_id_is_422(api_with_agent: Api, bad: str) -> None:
    before = everything(api_with_agent)
    response = api_with_agent.http.post("/v1/sessions", json={"agent": "echo", "session_id": bad})
    assert_error(response, 422)
    assert everything(api_with_agent) == before


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"session_id": "s1"},
        {"agent": "echo", "colour": "red"},
        {"agent": ""},
        {"agent": 7},
        ["echo"],
        None,
    ],
    ids=["empty", "missing-agent", "extra-field", "empty-agent", "wrong-type", "array", "null"],
)
def test_bad_create_body_is_422_with_our_error_shape(api_with_agent: Api, body: Any) -> None:
    before = everything(api_with_agent)
    response = api_with_agent.http.post("/v1/sessions", json=body)
    error = assert_error(response, 422, "invalid_request")
    problems = error["details"]["problems"]
    assert problems and all({"where", "problem"} <= set(p) for p in problems)
    assert everything(api_with_agent) == before


def test_create_body_that_is_not_json_is_422(api_with_agent: Api) -> None:
    response = api_with_agent.http.post(
        "/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(response, 422, "invalid_request")
    assert api_with_agent.all_sessions() == []


def test_get_unknown_session_is_404(api: Api) -> None:
    error = assert_error(api.http.get("/v1/sessions/nope"), 404, "not_found")
    assert "nope" in error["message"]


def test_message_to_an_unknown_session_is_404(api_with_agent: Api) -> None:
    response = api_with_agent.http.post("/v1/sessions/ghost/messages", json={"text": "hi"})
    assert_error(response, 404, "not_found")
    assert api_with_agent.all_sessions() == []
    assert_error(api_with_agent.http.get("/v1/sessions/ghost"), 404)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": ""},
        {"text": "hi", "extra": 1},
        {"text": "hi", "wait_seconds": -1},
        {"text": "hi", "message_id": ""},
        {"text": 5},
    ],
    ids=["empty", "empty-text", "extra-field", "negative-wait", "empty-message-id", "wrong-type"],
)
def test_bad_message_body_is_422_and_changes_nothing(api_with_agent: Api, body: Any) -> None:
    api_with_agent.create("s1")
    api_with_agent.send("s1", "first")
    before = everything(api_with_agent)
    response = api_with_agent.http.post("/v1/sessions/s1/messages", json=body)
    assert_error(response, 422, "invalid_request")
    assert everything(api_with_agent) == before


def test_oversized_body_with_content_length_is_413(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    before = everything(api_with_agent)
    response = api_with_agent.http.post(
        "/v1/sessions/s1/messages", json={"text": "x" * (MAX_BODY + 1)}
    )
    assert "content-length" in response.request.headers
    assert_error(response, 413, "body_too_large")
    response = api_with_agent.http.post(
        "/v1/sessions", json={"agent": "echo", "session_id": "s2", "pad": "x" * MAX_BODY}
    )
    assert_error(response, 413, "body_too_large")
    assert everything(api_with_agent) == before


def _chunks(total: int, size: int = 4096) -> Iterator[bytes]:
    body = b'{"text": "' + b"x" * total + b'"}'
    for i in range(0, len(body), size):
        yield body[i : i + size]


def test_oversized_chunked_body_is_413(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    before = everything(api_with_agent)
    response = api_with_agent.http.post(
        "/v1/sessions/s1/messages",
        content=_chunks(MAX_BODY + 1),
        headers={"content-type": "application/json"},
    )
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "body_too_large")
    assert everything(api_with_agent) == before


def test_chunked_body_under_the_limit_is_read_whole(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    response = api_with_agent.http.post(
        "/v1/sessions/s1/messages",
        content=_chunks(MAX_BODY - 100, size=1000),
        headers={"content-type": "application/json"},
    )
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert response.status_code == 201, response.text
    history = api_with_agent.snapshot("s1")["history"]
    assert history == [{"type": "user", "text": "x" * (MAX_BODY - 100)}]


def test_same_message_id_twice_is_one_message(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    first = api_with_agent.http.post(
        "/v1/sessions/s1/messages", json={"text": "hello", "message_id": "m-1"}
    )
    assert first.status_code == 201
    assert first.json()["turn"] == 1 and first.json()["created"] is True
    before = everything(api_with_agent)
    again = api_with_agent.http.post(
        "/v1/sessions/s1/messages", json={"text": "hello", "message_id": "m-1"}
    )
    assert again.status_code == 200
    assert again.json()["turn"] == 1 and again.json()["created"] is False
    assert everything(api_with_agent) == before
    # another message queues behind turn 1 (no Worker runs it); the repeat still maps to 1
    other = api_with_agent.send("s1", "second", message_id="m-2")
    assert other["turn"] == 2 and other["created"] is True
    assert api_with_agent.send("s1", "hello", message_id="m-1")["turn"] == 1
    assert api_with_agent.send("s1", "second", message_id="m-2")["created"] is False
    snapshot = api_with_agent.snapshot("s1")
    assert snapshot["history"] == [{"type": "user", "text": "hello"}]
    assert snapshot["session"]["messages_received"] == 2
    assert [m["number"] for m in snapshot["session"]["queued_messages"]] == [2]


def test_message_ids_are_per_session(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    api_with_agent.create("s2")
    assert api_with_agent.send("s1", "a", message_id="same")["created"] is True
    assert api_with_agent.send("s2", "b", message_id="same")["created"] is True
    assert api_with_agent.snapshot("s2")["history"] == [{"type": "user", "text": "b"}]


def test_turn_that_does_not_exist_is_404(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    for number in (0, 1, -1):
        response = api_with_agent.http.get(f"/v1/sessions/s1/turns/{number}")
        assert_error(response, 404, "not_found")
    api_with_agent.send("s1", "hi")
    before = everything(api_with_agent)
    assert_error(api_with_agent.http.get("/v1/sessions/s1/turns/2"), 404, "not_found")
    assert_error(api_with_agent.http.get("/v1/sessions/nope/turns/1"), 404, "not_found")
    assert_error(api_with_agent.http.get("/v1/sessions/s1/turns/one"), 422, "invalid_request")
    bad_wait = api_with_agent.http.get("/v1/sessions/s1/turns/1", params={"wait_seconds": -1})
    assert_error(bad_wait, 422, "invalid_request")
    assert everything(api_with_agent) == before


def test_turn_without_a_worker_stays_running(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    sent = api_with_agent.send("s1", "hi", wait_seconds=0.05)
    assert sent["status"] == "running" and sent["turn"] == 1
    assert api_with_agent.turn("s1", 1, wait=0.05)["status"] == "running"
    snapshot = api_with_agent.snapshot("s1")
    assert snapshot["session"]["status"] == "running"
    assert snapshot["current_turn"]["steps"][0]["type"] == "RunModel"
    assert snapshot["current_turn"]["steps"][0]["status"] == "queued"
    assert "a Worker that serves" in snapshot["waiting"][0]["waiting_for"]


# --- the Worker protocol --------------------------------------------------------------------------


def test_hello_registers_the_agents(api: Api, worker: FakeWorker) -> None:
    response = api.http.get("/v1/agents")
    assert response.status_code == 200
    agents = response.json()["agents"]
    assert [a["name"] for a in agents] == ["echo"]
    assert {t["name"]: t["kind"] for t in agents[0]["tools"]} == {
        "charge": "write",
        "lookup": "read",
    }
    assert _metrics(api)["dex_workers_connected"] == 1
    api.create("s1")  # the agent is known now


HELLO = b'{"t": "hello", "worker_id": "w", "agents": []}'


@pytest.mark.parametrize(
    "hello",
    [
        b"not json",
        b'[{"t": "hello"}]',
        b"[]",
        b'{"t": "hello", "worker_id": "w", "agents": 3}',
        b"[%s, %s]" % (HELLO, HELLO),  # once crashed the connection's handler
        b'[%s, {"t": "done", "attempt_id": "a"}]' % HELLO,
    ],
    ids=["not-json", "no-fields", "empty", "bad-agents", "two-hellos", "then-a-bad-message"],
)
def test_bad_hello_closes_the_socket(api: Api, hello: bytes) -> None:
    with api.http.websocket_connect("/v1/workers/connect") as ws:
        ws.send_bytes(hello)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
    assert closed.value.code == 4400
    assert api.http.get("/v1/agents").json()["agents"] == []
    assert _metrics(api)["dex_workers_connected"] == 0


def test_a_model_step_runs_to_a_completed_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    sent = api.send("s1", "hello")
    assert sent["turn"] == 1
    step = worker.step(session_id="s1")
    assert step["step_type"] == "RunModel"
    assert step["attempt"] == 1
    assert step["agent"] == "echo"
    assert step["history"] == [{"type": "user", "text": "hello"}]
    # the message is a StepMessage: the Worker reads it through that schema and its defaults
    handout = StepMessage.model_validate(step)
    assert handout.needs_start_ack is False
    assert handout.history == [UserItem(text="hello")]
    attempt = step["attempt_id"]

    assert worker.heartbeat(attempt) == {attempt: "ok"}
    running = api.snapshot("s1")
    assert running["current_turn"]["steps"][0]["status"] == "running"
    assert running["current_turn"]["steps"][0]["attempts"][0]["worker_id"] == "w-test"

    assert worker.done(attempt, model_done("hi there"))["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed"
    assert turn["text"] == "hi there"
    assert turn["error"] is None
    assert worker.heartbeat(attempt) == {attempt: "stop"}

    before = everything(api)
    assert before["snapshots"]["s1"]["session"]["status"] == "idle"
    assert before["snapshots"]["s1"]["history"] == [
        {"type": "user", "text": "hello"},
        {"type": "assistant", "text": "hi there", "tool_calls": []},
    ]
    duplicate = worker.done(attempt, model_done("something else"))
    assert duplicate["ok"] is False and duplicate["error"]
    assert everything(api) == before
    assert api.turn("s1", 1) == turn


def test_send_with_wait_returns_the_ended_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    # the wait holds this request open: hand the step out and answer it from the socket
    # first, by sending without waiting, then waiting on the turn with wait_seconds
    api.send("s1", "one", message_id="m1")
    step = worker.step(session_id="s1")
    worker.done(step["attempt_id"], model_done("answer"))
    again = api.send("s1", "one", message_id="m1", wait_seconds=10)
    assert again["created"] is False
    assert again["status"] == "completed" and again["text"] == "answer"


def test_a_message_during_a_turn_waits_for_the_next_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "first")
    first = worker.step(session_id="s1")
    assert api.send("s1", "second")["turn"] == 2
    assert api.snapshot("s1")["session"]["queued_messages"][0]["text"] == "second"
    worker.done(first["attempt_id"], model_done("one"))
    second = worker.step(session_id="s1", step_id="2.1")
    assert second["history"][-1] == {"type": "user", "text": "second"}
    worker.done(second["attempt_id"], model_done("two"))
    assert api.turn("s1", 2, wait=10)["text"] == "two"
    assert api.turn("s1", 1)["text"] == "one"


def test_a_retryable_failure_hands_out_attempt_2(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    first = worker.step(session_id="s1")
    assert first["attempt"] == 1
    error = RecoveryError(message="model overloaded", attempt_progress="NOT_COMPLETED")
    worker.send(
        {"t": "fail", "attempt_id": first["attempt_id"], "error": error.model_dump(mode="json")}
    )
    assert worker.ack(first["attempt_id"])["ok"] is True
    second = worker.step(session_id="s1", step_id=first["step_id"])
    assert second["attempt"] == 2
    assert second["attempt_id"] != first["attempt_id"]
    assert worker.heartbeat(first["attempt_id"], second["attempt_id"]) == {
        first["attempt_id"]: "stop",
        second["attempt_id"]: "ok",
    }
    refused = worker.done(first["attempt_id"], model_done("late"))
    assert refused["ok"] is False
    assert worker.done(second["attempt_id"], model_done("recovered"))["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed" and turn["text"] == "recovered"
    assert api.snapshot("s1")["history"][-1]["text"] == "recovered"


def test_a_non_retryable_failure_fails_the_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    error = RecoveryError(message="bad request", retryable=False)
    assert worker.fail(step["attempt_id"], error)["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "failed"
    assert "bad request" in turn["error"]
    assert api.snapshot("s1")["session"]["status"] == "failed"  # until the next turn


def test_a_handed_back_step_is_handed_out_again_as_attempt_1(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    worker.send({"t": "back", "attempt_id": step["attempt_id"]})
    assert worker.ack(step["attempt_id"])["ok"] is True
    again = worker.step(session_id="s1", step_id=step["step_id"])
    assert again["attempt"] == 1
    worker.done(again["attempt_id"], model_done("ok"))
    assert api.turn("s1", 1, wait=10)["status"] == "completed"


def test_tool_steps_and_the_start_ack_of_a_write_tool(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "charge and look up")
    model = worker.step(session_id="s1", step_type="RunModel")
    calls = [
        ModelToolCall(id="c1", name="charge", arguments={"amount": 5}),
        ModelToolCall(id="c2", name="lookup", arguments={"key": "k"}),
    ]
    assert worker.done(model["attempt_id"], model_done(tool_calls=calls))["ok"] is True

    charge = worker.step(session_id="s1", tool="charge")
    assert charge["step_type"] == "CallSingleAttemptTool"
    assert charge["needs_start_ack"] is True
    assert charge["arguments"] == {"amount": 5}
    assert charge["attempt"] == 1
    assert charge["idempotency_key"]
    lookup = worker.step(session_id="s1", tool="lookup")
    assert lookup["step_type"] == "CallTool"
    assert lookup["needs_start_ack"] is False
    assert lookup["idempotency_key"] and lookup["idempotency_key"] != charge["idempotency_key"]

    # the start acknowledgement: the first heartbeat of a running single-attempt tool is "ok"
    assert worker.heartbeat(charge["attempt_id"]) == {charge["attempt_id"]: "ok"}
    calls_now = api.snapshot("s1")["current_turn"]["tool_calls"]
    assert {c["name"]: c["status"] for c in calls_now} == {"charge": "running", "lookup": "running"}
    listed = api.snapshot("s1")["tool_calls"]
    assert [(c["turn"], c["name"], c["status"]) for c in listed] == [
        (1, "charge", "running"),
        (1, "lookup", "running"),
    ]

    assert worker.done(charge["attempt_id"], tool_done("charged 5"))["ok"] is True
    assert worker.done(lookup["attempt_id"], tool_done({"value": "K"}))["ok"] is True
    final = worker.step(session_id="s1", step_type="RunModel")
    assert final["step_id"] != model["step_id"] and final["attempt"] == 1
    results = [i for i in final["history"] if i["type"] == "tool_result"]
    assert [(r["call_id"], r["status"], r["result"]) for r in results] == [
        ("c1", "succeeded", "charged 5"),
        ("c2", "succeeded", {"value": "K"}),
    ]
    assert worker.done(final["attempt_id"], model_done("done: charged"))["ok"] is True

    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed" and turn["text"] == "done: charged"
    by_name = {c["name"]: c for c in turn["tool_calls"]}
    assert by_name["charge"]["status"] == "succeeded"
    assert by_name["charge"]["idempotency_key"] == charge["idempotency_key"]
    assert by_name["lookup"]["result"] == {"value": "K"}
    # the snapshot lists the calls of ended turns too
    api.send("s1", "one more")
    worker.done(worker.step(session_id="s1")["attempt_id"], model_done("bye"))
    api.turn("s1", 2, wait=10)
    listed = api.snapshot("s1")["tool_calls"]
    assert [(c["turn"], c["name"], c["status"], c["idempotency_key"]) for c in listed] == [
        (1, "charge", "succeeded", charge["idempotency_key"]),
        (1, "lookup", "succeeded", lookup["idempotency_key"]),
    ]


def test_a_result_the_server_cannot_use_is_refused_and_changes_nothing(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    before = everything(api)
    bad = worker.done(step["attempt_id"], {"text": 5, "unknown": True})
    assert bad["ok"] is False
    unknown = worker.done("nope/1.1/1", model_done("x"))
    assert unknown["ok"] is False
    garbage = worker.done("not-an-attempt-id", model_done("x"))
    assert garbage["ok"] is False
    assert everything(api) == before
    assert worker.heartbeat(step["attempt_id"]) == {step["attempt_id"]: "ok"}
    assert worker.done(step["attempt_id"], model_done("fine"))["ok"] is True
    assert api.turn("s1", 1, wait=10)["text"] == "fine"


@pytest.mark.parametrize(
    "frame",
    [
        b"{not json",
        b'{"t": "hb"}',
        b'["hb"]',
        b'[{"t": "hb"}]',
        b'[{"t": "hb", "attempts": 5}]',
        b'[{"t": "hb", "attempts": [null]}]',
        b'[{"t": "hb", "attempts": [7]}]',
        b'[{"t": "done", "attempt_id": 5, "result": {}}]',
        b'[{"t": "done", "attempt_id": "s1/1.1/1"}]',
        b'[{"t": "fail", "attempt_id": "s1/1.1/1", "error": {"nope": 1}}]',
        b'[{"t": "what"}]',
        b'[{"t": "hello", "worker_id": "again", "agents": []}]',
        b"",
    ],
    ids=[
        "not-json",
        "not-a-list",
        "not-an-object",
        "hb-without-attempts",
        "hb-bad-attempts",
        "hb-null-attempt",
        "hb-number-attempt",
        "attempt-id-not-a-string",
        "done-without-result",
        "fail-with-a-bad-error",
        "unknown-type",
        "second-hello",
        "empty",
    ],
)
def test_a_malformed_frame_closes_the_channel_and_changes_nothing(
    api: Api, worker: FakeWorker, frame: bytes
) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    before = everything(api)
    worker.ws.send_bytes(frame)
    with pytest.raises(ConnectionError, match="4400"):
        worker.expect("never")
    assert everything(api) == before
    assert _metrics(api)["dex_workers_connected"] == 0
    # the attempt stays held until its heartbeats stop, as after any disconnect
    assert step["attempt_id"] in api.sessions.dispatcher.held


@pytest.fixture
def short_heartbeat(tmp_path: Path) -> Iterator[Api]:
    """An app whose attempts fail after 1 s without a heartbeat."""
    asgi_app = make_api_app(tmp_path / "data", heartbeat_timeout=1.0)
    with TestClient(asgi_app) as client:
        yield Api(client, fastapi_of(asgi_app))


def test_an_attempt_without_heartbeats_fails_and_is_retried(short_heartbeat: Api) -> None:
    api = short_heartbeat
    with connect_fake_worker(api) as worker:
        api.create("s1")
        api.send("s1", "hello")
        first = worker.step(session_id="s1")
        assert first["attempt"] == 1
        # no heartbeat: the attempt fails and the Step is handed out again
        second = worker.step(session_id="s1", step_id=first["step_id"], attempt=2)
        assert worker.done(second["attempt_id"], model_done("in time"))["ok"] is True
        assert worker.heartbeat(first["attempt_id"]) == {first["attempt_id"]: "stop"}
        assert worker.done(first["attempt_id"], model_done("late"))["ok"] is False
        turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed" and turn["text"] == "in time"
    history = api.snapshot("s1")["history"]
    assert [i["text"] for i in history if i["type"] == "assistant"] == ["in time"]


def test_a_write_tool_whose_heartbeats_stop_is_outcome_unknown(short_heartbeat: Api) -> None:
    api = short_heartbeat
    with connect_fake_worker(api) as worker:
        api.create("s1")
        api.send("s1", "charge")
        model = worker.step(session_id="s1")
        calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
        worker.done(model["attempt_id"], model_done(tool_calls=calls))
        charge = worker.step(session_id="s1", tool="charge")
        assert charge["needs_start_ack"] is True
        # the Worker goes silent: a single-attempt tool is never handed out again
        final = worker.step(session_id="s1", step_type="RunModel")
        assert worker.done(final["attempt_id"], model_done("not sure it was charged"))["ok"]
        result = final["history"][-1]
        assert result["type"] == "tool_result" and result["status"] == "outcome_unknown"
        assert worker.heartbeat(charge["attempt_id"]) == {charge["attempt_id"]: "stop"}
        assert worker.done(charge["attempt_id"], tool_done("charged 5"))["ok"] is False
        turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed"
    (call,) = turn["tool_calls"]
    assert call["status"] == "outcome_unknown" and call["result"] is None
    assert not [m for m in worker.inbox if m.get("t") == "step" and m.get("tool") == "charge"]


# --- the body limit, chunk by chunk --------------------------------------------------------------
#
# TestClient hands a chunked body to the app in one piece; these drive the limit with a
# request body that really arrives in several ASGI messages, as uvicorn delivers it.


def _run_body_limit(chunks: list[bytes], limit: int) -> tuple[list[Message], list[bytes]]:
    seen_by_app: list[bytes] = []
    sent: list[Message] = []
    incoming: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen_by_app.append(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    anyio.run(BodyLimit(app, limit), scope, receive, send)
    return sent, seen_by_app


def test_body_limit_refuses_a_body_that_grows_past_it_in_chunks() -> None:
    sent, seen_by_app = _run_body_limit([b"x" * 4, b"x" * 4, b"x" * 4], limit=10)
    assert seen_by_app == [b"xxxx", b"xxxx"]  # streamed, never past the limit: no buffering
    assert sent[0]["status"] == 413  # (a Dex route answers it as JSON: see above)


def test_body_limit_replays_every_chunk_of_a_body_within_it() -> None:
    sent, seen_by_app = _run_body_limit([b"ab", b"cd", b"ef"], limit=6)
    assert seen_by_app == [b"ab", b"cd", b"ef"]
    assert sent[0]["status"] == 200

"""Requests the state refuses, or that cannot be stored, answer a 4xx JSON error and change
nothing; an unexpected failure still answers JSON. (Issue 8, items 4 and 5.)"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient
from starlette.types import Message, Scope

from dex.server.api.errors import BodyLimit
from dex.wire import Approval, ModelToolCall, ToolKind, ToolSpec
from tests.integration.conftest import (
    AGENT,
    Api,
    FakeWorker,
    connect_fake_worker,
    fastapi_of,
    make_api_app,
)
from tests.integration.test_api import assert_error, everything, model_done, tool_done

GATED = AGENT.model_copy(
    update={
        "tools": [
            ToolSpec(name="charge", kind=ToolKind.WRITE, approval=Approval.ALWAYS),
            *AGENT.tools[1:],
        ]
    }
)
"""The test agent, with ``charge`` waiting for an approval before it runs."""


def _gated_worker(api: Api) -> contextlib.AbstractContextManager[FakeWorker]:
    """A fake Worker serving GATED under the test agent's name."""
    return connect_fake_worker(api, agents=[GATED])


def _call_charge(api: Api, worker: FakeWorker, session_id: str = "s1") -> str:
    """Start a turn whose model calls ``charge``; returns the tool call's id."""
    api.create(session_id)
    api.send(session_id, "charge 5")
    model = worker.step(session_id=session_id)
    calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
    assert worker.done(model["attempt_id"], model_done(tool_calls=calls))["ok"]
    (pending,) = api.http.get(f"/v1/sessions/{session_id}/approvals").json()["approvals"]
    call_id: str = pending["call_id"]
    return call_id


RESOLUTIONS = [
    ("approve", {}),
    ("deny", {"reason": "no"}),
    ("answer", {"answer": "yes"}),
]


@pytest.mark.parametrize(("verb", "body"), RESOLUTIONS, ids=[v for v, _ in RESOLUTIONS])
def test_resolving_a_wait_after_its_turn_ended_is_409(
    api: Api, verb: str, body: dict[str, Any]
) -> None:
    with _gated_worker(api) as worker:
        call_id = _call_charge(api, worker)
        cancelled = api.http.post("/v1/sessions/s1/cancel", json={"reason": "changed my mind"})
        assert cancelled.status_code == 200, cancelled.text
        before = everything(api)
        late = api.http.post(f"/v1/sessions/s1/tool_calls/{call_id}/{verb}", json=body)
        error = assert_error(late, 409, "conflict")
        assert "turn 1 has ended (cancelled)" in error["message"], error
        assert error["details"]["call_id"] == call_id
        assert everything(api) == before


def test_a_second_approval_is_409_before_and_after_the_turn_ends(api: Api) -> None:
    with _gated_worker(api) as worker:
        call_id = _call_charge(api, worker)
        path = f"/v1/sessions/s1/tool_calls/{call_id}/approve"
        assert api.http.post(path, json={"by": "alice"}).status_code == 200
        assert_error(api.http.post(path, json={"by": "bob"}), 409, "conflict")
        charge = worker.step(session_id="s1", tool="charge")
        assert worker.done(charge["attempt_id"], tool_done("charged 5"))["ok"]
        final = worker.step(session_id="s1", step_type="RunModel")
        assert worker.done(final["attempt_id"], model_done("charged"))["ok"]
        assert api.turn("s1", 1, wait=10)["status"] == "completed"
        before = everything(api)
        error = assert_error(api.http.post(path, json={"by": "bob"}), 409, "conflict")
        assert "turn 1 has ended (completed)" in error["message"]
        assert "succeeded" in error["message"]
        assert everything(api) == before


@pytest.mark.parametrize(
    "call_id",
    ["1.9", "2.1", "99999999999999999999.1", "1.99999999999999999999", "1_0.1", "x"],
)
@pytest.mark.parametrize("verb", ["approve", "reconcile"])
def test_an_unknown_tool_call_is_404_whatever_its_id(api: Api, verb: str, call_id: str) -> None:
    with _gated_worker(api) as worker:
        _call_charge(api, worker)
        before = everything(api)
        body = {"status": "succeeded"} if verb == "reconcile" else {}
        response = api.http.post(f"/v1/sessions/s1/tool_calls/{call_id}/{verb}", json=body)
        assert_error(response, 404, "not_found")
        assert everything(api) == before


def test_a_duplicate_session_id_names_the_session_not_the_table(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    again = api_with_agent.http.post("/v1/sessions", json={"agent": "echo", "session_id": "s1"})
    error = assert_error(again, 409, "conflict")
    assert error["message"] == "session 's1' already exists"
    assert "UNIQUE" not in again.text and "sessions.id" not in again.text


def test_a_session_id_with_a_trailing_newline_is_refused(api_with_agent: Api) -> None:
    response = api_with_agent.http.post(
        "/v1/sessions", json={"agent": "echo", "session_id": "s1\n"}
    )
    assert_error(response, 422, "invalid_input")
    assert api_with_agent.all_sessions() == []


# --- a reconciled result that cannot be stored -------------------------------------------------


@pytest.fixture
def short_heartbeat(tmp_path: Path) -> Iterator[Api]:
    """An app whose attempts fail after 1 s without a heartbeat."""
    asgi_app = make_api_app(tmp_path / "data", heartbeat_timeout=1.0)
    with TestClient(asgi_app) as client:
        yield Api(client, fastapi_of(asgi_app))


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def test_a_reconcile_result_that_cannot_be_stored_is_422_and_changes_nothing(
    short_heartbeat: Api,
) -> None:
    api = short_heartbeat
    with connect_fake_worker(api) as worker:
        api.create("s1")
        api.send("s1", "charge")
        model = worker.step(session_id="s1")
        calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
        worker.done(model["attempt_id"], model_done(tool_calls=calls))
        worker.step(session_id="s1", tool="charge")  # and then silence: outcome_unknown
        final = worker.step(session_id="s1", step_type="RunModel")
        assert worker.done(final["attempt_id"], model_done("not sure"))["ok"]
        assert api.turn("s1", 1, wait=10)["status"] == "completed"
    path = "/v1/sessions/s1/tool_calls/1.1/reconcile"
    before = everything(api)
    for result, problem in [
        ('"\\ud800"', "surrogates"),
        ("[" * 300 + "]" * 300, "more than 64 levels"),
        ("[" * 65 + "]" * 65, "more than 64 levels"),
        ("100000000000000000000000", "64-bit"),
    ]:
        body = b'{"status": "succeeded", "result": ' + result.encode() + b"}"
        response = api.http.post(path, content=body, headers={"content-type": "application/json"})
        error = assert_error(response, 422, "invalid_input")
        assert problem in error["message"], error
        assert everything(api) == before
    # an outcome with the other outcome's field: the API would have dropped that field
    for body_, problem in [
        ({"status": "failed", "result": "never written", "error": "x"}, "drop result"),
        ({"status": "succeeded", "result": 1, "error": "it broke"}, "drop error"),
    ]:
        error = assert_error(api.http.post(path, json=body_), 422, "invalid_request")
        assert problem in str(error["details"]["problems"]), error
        assert everything(api) == before
    # the call is still outcome_unknown, and a storable result settles it
    fine = api.http.post(path, json={"status": "succeeded", "result": _nested(64)})
    assert fine.status_code == 200, fine.text
    assert fine.json()["status"] == "succeeded"
    assert api.turn("s1", 1)["tool_calls"][0]["result"] == _nested(64)


# --- Last-Event-ID -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"9" * 5000,
        b"\xb2",
        b"1.5",
        b"-1",
        b" 1",
        b"12345678901234567890",
        b"1-",
        b"1-2-3",
        b"1--2",
        b"a-1",
        b"1-12345678901234567890",
    ],
)
def test_a_last_event_id_that_is_not_an_event_id_is_422(api_with_agent: Api, header: bytes) -> None:
    api_with_agent.create("s1")
    response = api_with_agent.http.get(
        "/v1/sessions/s1/events", headers=[(b"last-event-id", header)]
    )
    error = assert_error(response, 422, "invalid_request")
    assert error["details"]["problems"][0]["where"] == "header.last-event-id"


# --- anything else -----------------------------------------------------------------------------


def test_an_unexpected_exception_answers_500_and_logs_its_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON on the API; on a console path the console's error page, with the same 500."""
    asgi_app = make_api_app(tmp_path / "data")
    app = fastapi_of(asgi_app)
    assert isinstance(app, FastAPI)

    @app.get("/v1/boom")
    @app.get("/ui/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    with TestClient(asgi_app) as client, caplog.at_level(logging.ERROR, "dex.server.api"):
        response = client.get("/v1/boom")
        page = client.get("/ui/boom")
    error = assert_error(response, 500, "internal_error")
    assert "secret" not in response.text
    records = [r for r in caplog.records if getattr(r, "action", None) == "http.unhandled"]
    assert len(records) == 2
    for record in records:
        assert record.exc_info is not None and "secret internals" in str(record.exc_info[1])
    assert error["message"]
    assert page.status_code == 500
    assert page.headers["content-type"].startswith("text/html")
    assert "500 · internal_error" in page.text and "secret" not in page.text
    assert error["message"] in page.text


@pytest.mark.parametrize(
    "body", [b'{"agent": "\xff"}', b"[" * 5_000], ids=["invalid-utf8", "too-deep"]
)
def test_a_body_the_json_parser_cannot_read_is_400(api_with_agent: Api, body: bytes) -> None:
    response = api_with_agent.http.post(
        "/v1/sessions", content=body, headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "http_error")
    assert api_with_agent.all_sessions() == []


@pytest.mark.parametrize("declared", [b"9" * 5000, b"99999999999999999999"])
def test_a_huge_declared_content_length_is_413(declared: bytes) -> None:
    sent: list[Message] = []
    ran: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(True)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/sessions",
        "headers": [(b"content-length", declared)],
    }
    anyio.run(BodyLimit(app, 1024), scope, receive, send)
    assert not ran
    assert sent[0]["status"] == 413

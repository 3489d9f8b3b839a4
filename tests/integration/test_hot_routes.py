"""The routes served without the framework (``api/hot.py``: the session creation and the
message send) answer every request exactly as the FastAPI routes behind them do (the ones
the OpenAPI document describes), only cheaper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from dex.server.api.browsers import Browsers
from dex.server.api.errors import BodyLimit
from dex.server.api.hot import HotRoutes
from dex.server.app import create_app
from dex.server.config import ServerConfig
from tests.integration.conftest import AGENT, MAX_BODY, Api, fastapi_of, make_api_app

JSON = {"content-type": "application/json"}
CREATE = "/v1/sessions"
SEND = "/v1/sessions/a/messages"
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    (CREATE, {"json": {"agent": "echo", "session_id": "a"}}),
    (CREATE, {"json": {"agent": "echo"}}),
    (CREATE, {"json": {"agent": "echo", "session_id": "a"}}),  # it exists now: 409
    (CREATE, {"json": {"agent": "nobody"}}),
    (CREATE, {"json": {"agent": "echo", "session_id": "has space"}}),
    (CREATE, {"json": {"agent": "echo", "session_id": ""}}),
    (CREATE, {"json": {"agent": "echo", "colour": "red"}}),
    (CREATE, {"json": {"agent": 7}}),
    (CREATE, {"json": ["echo"]}),
    (CREATE, {"content": b"{not json", "headers": JSON}),
    (CREATE, {"content": b'{"agent": "\xff"}', "headers": JSON}),
    (CREATE, {"content": b'{"agent": "echo", "session_id": "b"}', "headers": {}}),
    (
        CREATE,
        {"content": b'{"agent": "echo", "session_id": "c"}', "headers": {"content-type": "text/x"}},
    ),
    (
        CREATE,
        {
            "content": b'{"agent": "echo", "session_id": "d"}',
            "headers": {"content-type": "application/json; charset=utf-8"},
        },
    ),
    (SEND, {"json": {"text": "hello"}}),
    (SEND, {"json": {"text": "again", "message_id": "m1"}}),
    (SEND, {"json": {"text": "again", "message_id": "m1"}}),  # the same id: 200, the first
    (SEND, {"json": {"text": "waits", "wait_seconds": 0.01}}),  # no Worker: still running
    (SEND, {"json": {"text": ""}}),
    (SEND, {"json": {"text": "x", "colour": "red"}}),
    (SEND, {"content": b"{not json", "headers": JSON}),
    ("/v1/sessions/nobody/messages", {"json": {"text": "hello"}}),
    ("/v1/sessions/a/messages/", {"json": {"text": "hello"}}),
]


def answers(client: TestClient, api: Api) -> list[tuple[int, Any]]:
    api.register(AGENT)
    found = []
    for path, request in REQUESTS:
        response = client.post(path, **request)
        body = response.json()
        if response.status_code == 201 and path == CREATE:
            body.pop("created_at")  # clock readings
            body.pop("updated_at")
            if body["id"].startswith("s_"):
                body["id"] = "<generated>"
        found.append((response.status_code, body))
    return found


def test_the_hot_routes_answer_every_request_as_the_fastapi_routes_do(tmp_path: Path) -> None:
    hot = make_api_app(tmp_path / "hot")
    assert isinstance(hot.app, Browsers) and isinstance(hot.app.app, BodyLimit)
    assert isinstance(hot.app.app.app, HotRoutes)
    config = ServerConfig(data_dir=tmp_path / "fastapi", max_body_bytes=MAX_BODY)
    fastapi_only = BodyLimit(create_app(config), MAX_BODY)

    with TestClient(hot) as client:
        api = Api(client, fastapi_of(hot))
        by_hot = answers(client, api)
        stored = {s["id"] for s in api.all_sessions()}
        received = api.snapshot("a")["session"]["messages_received"]
    with TestClient(fastapi_only) as client:
        by_fastapi = answers(client, Api(client, fastapi_of(fastapi_only)))

    assert by_hot == by_fastapi
    created = [
        body["id"]
        for (path, _), (status, body) in zip(REQUESTS, by_hot, strict=True)
        if path == CREATE and status == 201
    ]
    assert created == ["a", "<generated>", "d"]
    assert len(stored) == 3 and {"a", "d"} <= stored  # a refused creation stored nothing
    assert received == 4  # a refused send sent nothing (the trailing / is redirected, sent)

"""The plain route for ``POST /v1/sessions`` answers every request exactly as the FastAPI
route behind it does (the one the OpenAPI document describes), only cheaper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from dex.server.api.errors import BodyLimit
from dex.server.api.plain import PlainRoutes
from dex.server.app import create_app
from dex.server.config import ServerConfig
from tests.integration.conftest import AGENT, MAX_BODY, Api, make_api_app

JSON = {"content-type": "application/json"}
REQUESTS: list[dict[str, Any]] = [
    {"json": {"agent": "echo", "session_id": "a"}},
    {"json": {"agent": "echo"}},
    {"json": {"agent": "echo", "session_id": "a"}},  # exists now: 409
    {"json": {"agent": "nobody"}},
    {"json": {"agent": "echo", "session_id": "has space"}},
    {"json": {"agent": "echo", "session_id": ""}},
    {"json": {"agent": "echo", "colour": "red"}},
    {"json": {"agent": 7}},
    {"json": ["echo"]},
    {"content": b"{not json", "headers": JSON},
    {"content": b'{"agent": "\xff"}', "headers": JSON},
    {"content": b'{"agent": "echo", "session_id": "b"}', "headers": {"content-type": "text/plain"}},
    {"content": b'{"agent": "echo", "session_id": "c"}'},
    {
        "content": b'{"agent": "echo", "session_id": "d"}',
        "headers": {"content-type": "application/json; charset=utf-8"},
    },
]


def answers(client: TestClient, api: Api) -> list[tuple[int, Any]]:
    api.register(AGENT)
    found = []
    for request in REQUESTS:
        response = client.post("/v1/sessions", **request)
        body = response.json()
        if response.status_code == 201:
            body.pop("created_at")  # a clock reading
            if body["id"].startswith("s_"):
                body["id"] = "<generated>"
        found.append((response.status_code, body))
    return found


def test_the_plain_route_answers_every_request_as_the_fastapi_route_does(tmp_path: Path) -> None:
    plain = make_api_app(tmp_path / "plain")
    assert isinstance(plain, BodyLimit) and isinstance(plain.app, PlainRoutes)
    config = ServerConfig(data_dir=tmp_path / "fastapi", max_body_bytes=MAX_BODY)
    fastapi_only = BodyLimit(create_app(config), MAX_BODY)

    with TestClient(plain) as client:
        by_plain = answers(client, Api(client, plain))
        stored = {s["id"] for s in Api(client, plain).all_sessions()}
    with TestClient(fastapi_only) as client:
        by_fastapi = answers(client, Api(client, fastapi_only))

    assert by_plain == by_fastapi
    created = [body["id"] for status, body in by_plain if status == 201]
    assert created == ["a", "<generated>", "d"]
    assert len(stored) == 3 and {"a", "d"} <= stored  # a refused request stored nothing

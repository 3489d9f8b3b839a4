"""With tokens configured, every endpoint but the probes needs one of the right role."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from dex.server.api.auth import Role, role_for
from dex.server.app import asgi
from dex.server.config import ServerConfig
from tests.integration.conftest import run_server

CLIENT, WORKER, ADMIN = "client-secret", "worker-secret", "admin-secret"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    config = ServerConfig(
        data_dir=tmp_path, client_token=CLIENT, worker_token=WORKER, admin_token=ADMIN
    )
    with TestClient(asgi(config)) as client:
        yield client


def test_paths_need_the_role_that_uses_them() -> None:
    assert role_for("/healthz") is None and role_for("/readyz") is None
    assert role_for("/openapi.json") is None
    assert role_for("/v1/sessions/s1/messages") == Role.CLIENT
    assert role_for("/v1/workers/connect") == Role.WORKER
    assert role_for("/metrics") == Role.ADMIN


def test_no_token_is_a_401_with_a_json_body_and_changes_nothing(http: TestClient) -> None:
    refused = http.post("/v1/sessions", json={"agent": "a"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert http.get("/v1/sessions", headers=bearer("wrong")).status_code == 401
    listed = http.get("/v1/sessions", headers=bearer(CLIENT))
    assert listed.status_code == 200 and listed.json() == {"sessions": [], "next_cursor": None}


def test_a_token_of_another_role_is_a_403(http: TestClient) -> None:
    forbidden = http.get("/v1/sessions", headers=bearer(WORKER))
    assert forbidden.status_code == 403
    assert "needs a client token" in forbidden.json()["error"]["message"]
    assert http.get("/metrics", headers=bearer(CLIENT)).status_code == 403
    assert http.get("/metrics", headers=bearer(ADMIN)).status_code == 200
    assert http.get("/v1/sessions", headers=bearer(ADMIN)).status_code == 200


def test_probes_and_the_api_description_stay_open(http: TestClient) -> None:
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
    assert http.get("/openapi.json").status_code == 200


def test_the_worker_channel_needs_a_worker_token(http: TestClient) -> None:
    # the handshake is refused with an HTTP answer, as the docs say: 401 without a valid
    # token, 403 with one of another role, each with the JSON error body
    with (
        pytest.raises(WebSocketDenialResponse) as missing,
        http.websocket_connect("/v1/workers/connect"),
    ):
        pass
    assert missing.value.status_code == 401
    assert missing.value.json()["error"]["code"] == "unauthorized"
    assert missing.value.headers["www-authenticate"] == "Bearer"
    with (
        pytest.raises(WebSocketDenialResponse) as wrong,
        http.websocket_connect("/v1/workers/connect", headers=bearer("not-a-token")),
    ):
        pass
    assert wrong.value.status_code == 401
    with (
        pytest.raises(WebSocketDenialResponse) as refused,
        http.websocket_connect("/v1/workers/connect", headers=bearer(CLIENT)),
    ):
        pass
    assert refused.value.status_code == 403
    assert "needs a worker token" in refused.value.json()["error"]["message"]
    with http.websocket_connect("/v1/workers/connect", headers=bearer(WORKER)) as ws:
        ws.send_bytes(b'[{"t": "hello", "worker_id": "w1", "agents": [], "capacity": 1}]')
        assert b'"welcome"' in ws.receive_bytes()


async def test_a_real_server_refuses_a_worker_handshake_with_401_or_403(tmp_path: Path) -> None:
    """Through uvicorn, as a Worker's aiohttp client sees it."""
    async with run_server(
        tmp_path / "data", client_token=CLIENT, worker_token=WORKER, admin_token=ADMIN
    ) as address:
        url = address.replace("http://", "ws://") + "/v1/workers/connect"
        async with aiohttp.ClientSession() as http:
            for headers, status in [({}, 401), (bearer("nope"), 401), (bearer(CLIENT), 403)]:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    async with http.ws_connect(url, headers=headers):
                        pass
                assert refused.value.status == status, headers
            async with http.ws_connect(url, headers=bearer(WORKER)) as ws:
                await ws.send_bytes(b'[{"t": "hello", "worker_id": "w1", "agents": []}]')
                assert b'"welcome"' in await ws.receive_bytes(timeout=10)

"""With tokens configured, every endpoint but the probes needs one of the right role: each
role is tried on every route of the app's route table (a new route without an expected
role fails the test). Tokens from a file are kept as SHA-256 hashes and read again when
the file changes; a worker token may be scoped to some agents; the client API is rate
limited per token."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from starlette.routing import BaseRoute
from starlette.testclient import TestClient, WebSocketDenialResponse

from dex.errors import InvalidInput
from dex.server.api.auth import Role, role_for
from dex.server.api.tokens import Tokens, digest
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.testing import wait_until
from tests.integration.conftest import (
    ADMIN,
    AGENT,
    CLIENT,
    WORKER,
    Api,
    connect_fake_worker,
    fastapi_of,
    run_server,
)

ROTATED, SCOPED = "client-rotated", "worker-scoped"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def entry(role: str, token: str, name: str, **more: Any) -> str:
    lines = [
        "[[token]]",
        f'name = "{name}"',
        f'role = "{role}"',
        f'sha256 = "{digest(token).hex()}"',
    ]
    for key, value in more.items():
        rendered = (
            "[" + ", ".join(f'"{v}"' for v in value) + "]"
            if isinstance(value, list)
            else f'"{value}"'
        )
        lines.append(f"{key} = {rendered}")
    return "\n".join(lines) + "\n\n"


@pytest.fixture
def http(guarded: TestClient) -> TestClient:
    return guarded


# --- every role on every route -------------------------------------------------------------------

OPEN = "open"
EXPECTED: dict[str, str] = {
    "root": OPEN,  # a redirect to the console, which asks for the token
    "openapi": OPEN,
    "swagger_ui_html": OPEN,
    "swagger_ui_redirect": OPEN,
    "redoc_html": OPEN,
    "healthz": OPEN,
    "readyz": OPEN,
    "metrics": Role.ADMIN,
    "step_down": Role.ADMIN,
    "get_limits": Role.ADMIN,
    "set_limit": Role.ADMIN,
    "clear_limit": Role.ADMIN,
    "list_tenants": Role.ADMIN,
    "get_tenant": Role.ADMIN,
    "set_tenant_budget": Role.ADMIN,
    "remove_tenant_budget": Role.ADMIN,
    "set_budget": Role.CLIENT,
    "remove_budget": Role.CLIENT,
    "create_session": Role.CLIENT,
    "list_sessions": Role.CLIENT,
    "fork_session": Role.CLIENT,
    "list_inbox": Role.CLIENT,
    "get_agent_snapshot": Role.CLIENT,
    "send_message": Role.CLIENT,
    "get_turn": Role.CLIENT,
    "list_agents": Role.CLIENT,
    "list_approvals": Role.CLIENT,
    "approve": Role.CLIENT,
    "deny": Role.CLIENT,
    "answer": Role.CLIENT,
    "cancel": Role.CLIENT,
    "reconcile": Role.CLIENT,
    "stream_events": Role.CLIENT,
    "list_workers": Role.CLIENT,
    "get_cluster": Role.CLIENT,
    "worker_channel": Role.WORKER,
    # the web console: read and act like the client API (its tenants page like /admin);
    # its log-in and files are open
    "console_inbox": Role.CLIENT,
    "console_sessions": Role.CLIENT,
    "console_session": Role.CLIENT,
    "console_events": Role.CLIENT,
    "console_cluster": Role.CLIENT,
    "console_approve": Role.CLIENT,
    "console_deny": Role.CLIENT,
    "console_answer": Role.CLIENT,
    "console_reconcile": Role.CLIENT,
    "console_cancel": Role.CLIENT,
    "console_send": Role.CLIENT,
    "console_budget": Role.CLIENT,
    "console_tenants": Role.ADMIN,  # like /admin/tenants, which it shows and calls
    "console_tenant_budget": Role.ADMIN,
    "console_login_form": OPEN,
    "console_login": OPEN,
    "console_logout": OPEN,
    "console_static": OPEN,
}
"""The role each route needs, by route name. A route missing here fails the test below:
decide who may call it before it ships."""


def routes(table: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, with the routers FastAPI includes opened up."""
    for route in table:
        inner = getattr(route, "original_router", None)  # FastAPI >= 0.165 includes lazily
        if inner is not None:
            yield from routes(inner.routes)
        else:
            yield route


def test_every_route_of_the_route_table_answers_each_role_as_expected(http: TestClient) -> None:
    found = {getattr(r, "name", ""): r for r in routes(fastapi_of(http.app).routes)}
    assert set(found) == set(EXPECTED), (
        f"give these routes an expected role: {set(found) ^ set(EXPECTED)}"
    )
    tokens = {
        "none": None,
        "unknown": "not-a-token",
        Role.CLIENT: CLIENT,
        Role.WORKER: WORKER,
        Role.ADMIN: ADMIN,
    }
    checked = 0
    for name, route in found.items():
        path = re.sub(r"{(\w+)}", lambda m: "1" if m[1] == "number" else "nope", route.path)  # type: ignore[attr-defined]
        needed = EXPECTED[name]
        assert role_for(path) == (None if needed == OPEN else needed), name
        for who, token in tokens.items():
            status = _status(http, route, path, token)
            if needed == OPEN:
                allowed = True
            elif token is None or who == "unknown":
                assert status == 401, (name, who, status)
                continue
            else:
                allowed = who in (needed, Role.ADMIN)
            if allowed:
                assert status not in (401, 403), (name, who, status)
            else:
                assert status == 403, (name, who, status)
            checked += 1
    assert checked > 60


def _status(http: TestClient, route: BaseRoute, path: str, token: str | None) -> int:
    headers = bearer(token) if token else {}
    if getattr(route, "methods", None) is None:  # the Worker channel: a WebSocket
        try:
            with http.websocket_connect(path, headers=headers) as ws:
                ws.send_bytes(b'[{"t": "hello", "worker_id": "w", "agents": []}]')
                ws.receive_bytes()
                return 101
        except WebSocketDenialResponse as refused:
            return refused.status_code
    method = sorted(route.methods - {"HEAD"})[0]  # type: ignore[attr-defined]
    return http.request(
        method,
        path,
        headers=headers,
        json={} if method == "POST" else None,
        follow_redirects=False,  # this route's own answer
    ).status_code


def test_guarded_operations_carry_the_bearer_scheme_so_docs_can_authorize(http: TestClient) -> None:
    document = http.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            guarded = role_for(path) is not None
            assert (operation.get("security") == [{"bearer": []}]) is guarded, (method, path)
            assert ("401" in operation["responses"]) is guarded, (method, path)


def test_no_token_is_a_401_with_a_json_body_and_changes_nothing(http: TestClient) -> None:
    refused = http.post("/v1/sessions", json={"agent": "a"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert http.get("/v1/sessions", headers=bearer("wrong")).status_code == 401
    listed = http.get("/v1/sessions", headers=bearer(CLIENT))
    assert listed.status_code == 200 and listed.json() == {"sessions": [], "next_cursor": None}


def test_a_token_of_another_role_is_a_403_with_a_json_body(http: TestClient) -> None:
    forbidden = http.get("/v1/sessions", headers=bearer(WORKER))
    assert forbidden.status_code == 403
    assert "needs a client token" in forbidden.json()["error"]["message"]


def test_the_worker_channel_refuses_before_the_upgrade_with_the_json_body(http: TestClient) -> None:
    with (
        pytest.raises(WebSocketDenialResponse) as missing,
        http.websocket_connect("/v1/workers/connect"),
    ):
        pass
    assert missing.value.status_code == 401
    assert missing.value.json()["error"]["code"] == "unauthorized"
    assert missing.value.headers["www-authenticate"] == "Bearer"
    with (
        pytest.raises(WebSocketDenialResponse) as refused,
        http.websocket_connect("/v1/workers/connect", headers=bearer(CLIENT)),
    ):
        pass
    assert refused.value.status_code == 403
    assert "needs a worker token" in refused.value.json()["error"]["message"]


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


# --- the tokens file -----------------------------------------------------------------------------


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "# the node's tokens, by hash\n"
        + entry("client", CLIENT, "web")
        + entry("worker", SCOPED, "echo-workers", agents=["echo"])
        + entry("admin", ADMIN, "ops")
    )
    return path


@pytest.fixture
def api_with_file(tmp_path: Path, tokens_file: Path) -> Iterator[Api]:
    config = ServerConfig(data_dir=tmp_path / "data", tokens_file=tokens_file)
    app = asgi(config)
    with TestClient(app, headers=bearer(ADMIN)) as client:
        yield Api(client, fastapi_of(app))


def test_the_file_keeps_hashes_only_and_its_tokens_let_their_roles_in(
    api_with_file: Api, tokens_file: Path
) -> None:
    http = api_with_file.http
    assert CLIENT not in tokens_file.read_text()
    assert http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 200
    assert http.get("/v1/sessions", headers=bearer(SCOPED)).status_code == 403
    assert http.get("/v1/sessions", headers=bearer(WORKER)).status_code == 401  # not in the file


def test_a_rotation_needs_no_restart_and_both_tokens_work_meanwhile(
    api_with_file: Api, tokens_file: Path
) -> None:
    http = api_with_file.http
    text = tokens_file.read_text()
    tokens_file.write_text(text + entry("client", ROTATED, "web-next"))
    wait_until(
        lambda: http.get("/v1/sessions", headers=bearer(ROTATED)).status_code == 200,
        5,
        what="the new token is read",
    )
    assert http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 200  # both valid
    tokens_file.write_text(text.replace(digest(CLIENT).hex(), digest(ROTATED).hex()))
    wait_until(
        lambda: http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 401,
        5,
        what="the old token is gone",
    )
    assert http.get("/v1/sessions", headers=bearer(ROTATED)).status_code == 200


def test_a_broken_file_keeps_the_tokens_read_before_and_says_so(
    api_with_file: Api, tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    http = api_with_file.http
    tokens_file.write_text("[[token]]\nrole = 'client'\nsha256 = 'not hex'\n")

    def noticed() -> bool:
        assert http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 200
        return any(r.__dict__.get("action") == "auth.tokens_file_invalid" for r in caplog.records)

    wait_until(noticed, 5, what="the broken file is noticed (on a request)")
    assert "sha256" in caplog.text
    assert http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 200


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[token]]\nrole = 'client'\n", "sha256: Field required"),
        ("[[token]]\nrole = 'boss'\nsha256 = '" + "a" * 64 + "'\n", "role"),
        (
            "[[token]]\nrole = 'client'\nsha256 = '" + "a" * 64 + "'\nagents = ['x']\n",
            "limits a worker token",
        ),
        (
            "[[token]]\nrole = 'client'\nsha256 = '" + "a" * 64 + "'\nrate_limit = 'fast'\n",
            "rate limit 'fast'",
        ),
        ("[[token]]\nrole = 'client'\nsha256 = '" + "a" * 64 + "'\nsurprise = 1\n", "surprise"),
        ("[[token]\n", "not valid TOML"),
    ],
)
def test_a_wrong_tokens_file_stops_the_start_with_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=re.escape(problem)):
        Tokens({}, path)


def test_every_hash_is_compared_whichever_matches() -> None:
    """Constant time: the offered token is hashed once and compared with each known hash."""
    tokens = Tokens({Role.CLIENT: CLIENT, Role.WORKER: WORKER, Role.ADMIN: ADMIN})
    compared: list[bytes] = []
    import hmac

    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hmac, "compare_digest", counting)
        for offered in (CLIENT, ADMIN, "nope"):
            compared.clear()
            tokens.match(offered.encode())
            assert len(compared) == 3, offered


# --- a worker token scoped to agents -------------------------------------------------------------


def test_a_scoped_worker_token_serves_its_agents_and_is_refused_for_others(
    api_with_file: Api,
) -> None:
    api = api_with_file
    api.http.headers.update(bearer(SCOPED))
    other = AGENT.model_copy(update={"name": "billing"})
    with (
        pytest.raises(ConnectionError, match=r"4403.*may not serve billing"),
        connect_fake_worker(api, "w-other", agents=[AGENT, other]),
    ):
        pass
    assert (
        api.http.get("/v1/agents", headers=bearer(ADMIN)).json()["agents"] == []
    )  # nothing registered
    with connect_fake_worker(api, "w-echo", agents=[AGENT]) as worker:
        assert worker.welcome["worker_id"] == "w-echo"


# --- rate limits ---------------------------------------------------------------------------------


def test_over_its_rate_limit_a_token_gets_429_with_retry_after_and_others_go_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(
        entry("client", CLIENT, "web", rate_limit="3/minute")
        + entry("client", ROTATED, "batch")
        + entry("admin", ADMIN, "ops")
    )
    config = ServerConfig(data_dir=tmp_path / "data", tokens_file=path, rate_limit="5/minute")
    with TestClient(asgi(config)) as http:
        for _ in range(3):
            assert http.get("/v1/sessions", headers=bearer(CLIENT)).status_code == 200
        refused = http.post(
            "/v1/sessions", json={"agent": "echo", "session_id": "s1"}, headers=bearer(CLIENT)
        )
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        error = refused.json()["error"]
        assert error["code"] == "rate_limited"
        assert "token 'web' is over its rate limit of 3 per 1 minute" in error["message"]
        assert error["details"] == {
            "limit": "3 per 1 minute",
            "retry_after": int(refused.headers["retry-after"]),
        }
        # the default limit applies to the other token; the Worker channel and probes have none
        for _ in range(5):
            assert http.get("/v1/sessions", headers=bearer(ROTATED)).status_code == 200
        assert http.get("/v1/sessions", headers=bearer(ROTATED)).status_code == 429
        assert http.get("/metrics", headers=bearer(ADMIN)).status_code == 200
        # the refused create changed nothing
        assert http.get("/v1/sessions", headers=bearer(ADMIN)).json()["sessions"] == []


def test_with_auth_off_the_limit_is_kept_per_address(tmp_path: Path) -> None:
    with TestClient(asgi(ServerConfig(data_dir=tmp_path, rate_limit="2/minute"))) as http:
        assert [http.get("/v1/sessions").status_code for _ in range(3)] == [200, 200, 429]
        assert "address testclient" in http.get("/v1/sessions").json()["error"]["message"]

"""Fixtures for the integration tests.

test_api: the app in process through Starlette's TestClient, and a fake Worker that
speaks the Worker protocol over the real WebSocket route.
test_client: a real uvicorn server in process on a free port, a real ``dex.Worker``
serving a scripted agent, and a ``dex.Client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.testclient import TestClient, WebSocketTestSession

import dex
from dex.models import Scripted, call, say
from dex.server.api.browsers import Browsers
from dex.server.api.errors import BodyLimit
from dex.server.api.forward import Forward
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.server.sessions import Sessions
from dex.testing import free_port, wait_until_async
from dex.wire import (
    AgentSpec,
    Item,
    ModelResponse,
    RecoveryError,
    RetryPolicy,
    ToolKind,
    ToolResultItem,
    ToolSpec,
    UserItem,
)

MAX_BODY = 64 * 1024
HEARTBEAT_TIMEOUT = 30.0
"""Long enough that no attempt of these tests expires unless a test means it to."""

AGENT = AgentSpec(
    name="echo",
    model={"provider": "scripted", "name": "test"},
    tools=[
        ToolSpec(name="charge", kind=ToolKind.WRITE),
        ToolSpec(name="lookup", kind=ToolKind.READ, retry=RetryPolicy(initial_backoff_seconds=0)),
    ],
    model_retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
)


class Api:
    """The app under test, its HTTP client and its domain object."""

    def __init__(self, client: TestClient, app: Any) -> None:
        self.http = client
        self.app = app

    @property
    def sessions(self) -> Sessions:
        sessions: Sessions = self.app.state.sessions
        return sessions

    def register(self, *specs: AgentSpec) -> None:
        """Register agents inside the running app, as a Worker's hello would."""
        assert self.http.portal is not None
        self.http.portal.call(self.sessions.register_agents, list(specs))

    def create(self, session_id: str | None = None, agent: str = AGENT.name) -> dict[str, Any]:
        body: dict[str, Any] = {"agent": agent}
        if session_id is not None:
            body["session_id"] = session_id
        response = self.http.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result

    def send(self, session_id: str, text: str, **extra: Any) -> dict[str, Any]:
        response = self.http.post(
            f"/v1/sessions/{session_id}/messages", json={"text": text, **extra}
        )
        assert response.status_code in (200, 201), response.text
        result: dict[str, Any] = response.json()
        return result

    def snapshot(self, session_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/sessions/{session_id}")
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def turn(self, session_id: str, number: int, wait: float = 0) -> dict[str, Any]:
        response = self.http.get(
            f"/v1/sessions/{session_id}/turns/{number}", params={"wait_seconds": wait}
        )
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def all_sessions(self) -> list[dict[str, Any]]:
        response = self.http.get("/v1/sessions", params={"limit": 1000})
        assert response.status_code == 200, response.text
        rows: list[dict[str, Any]] = response.json()["sessions"]
        return rows


def fastapi_of(app: Any) -> FastAPI:
    """The FastAPI app inside the node's layers (each holds the next as ``.app``)."""
    while not isinstance(app, FastAPI):
        app = app.app
    return app


def make_api_app(
    data_dir: Path, heartbeat_timeout: float = HEARTBEAT_TIMEOUT, reconnect_grace: float = 1.0
) -> Forward:
    """The node's ASGI app: the FastAPI app (``fastapi_of``) behind the body limit, the
    refusal of other sites' requests, and the forwarding layer (which passes everything
    on: the node has no cluster)."""
    app = asgi(
        ServerConfig(
            data_dir=data_dir,
            heartbeat_timeout=heartbeat_timeout,
            reconnect_grace=reconnect_grace,
            max_body_bytes=MAX_BODY,
        )
    )
    assert isinstance(app, Forward) and isinstance(app.app, Browsers)
    assert isinstance(app.app.app, BodyLimit)
    return app


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """The app with its lifespan running; no agent registered yet."""
    asgi_app = make_api_app(tmp_path / "data")
    with TestClient(asgi_app) as client:
        yield Api(client, fastapi_of(asgi_app))


@pytest.fixture
def api_with_agent(api: Api) -> Api:
    api.register(AGENT)
    return api


class FakeWorker:
    """Speaks the Worker protocol by hand over a TestClient WebSocket."""

    def __init__(self, ws: WebSocketTestSession) -> None:
        self.ws = ws
        self.inbox: list[dict[str, Any]] = []
        self.welcome: dict[str, Any] = {}

    def send(self, *messages: dict[str, Any]) -> None:
        self.ws.send_bytes(orjson.dumps(list(messages)))

    def _receive_frame(self, timeout: float) -> None:
        async def get() -> Any:
            with anyio.fail_after(timeout):
                # The public receive() has no deadline; this is the stream it reads.
                return await self.ws._send_rx.receive()

        message = self.ws.portal.call(get)
        if message["type"] == "websocket.close":
            raise ConnectionError(f"closed by the server: {message}")
        raw = message.get("bytes") or message.get("text")
        self.inbox.extend(orjson.loads(raw))

    def expect(
        self, match: Callable[[dict[str, Any]], bool] | str, timeout: float = 10.0
    ) -> dict[str, Any]:
        """The first message (received or still to come) that matches; it is taken out."""
        predicate = (lambda m: m.get("t") == match) if isinstance(match, str) else match
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self.inbox):
                if predicate(message):
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching message within {timeout}s; got {self.inbox}")
            try:
                self._receive_frame(left)
            except TimeoutError:
                continue  # the check above reports what did arrive

    def step(self, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """The next hand-out whose fields match ``fields``."""
        return self.expect(
            lambda m: m.get("t") == "step" and all(m.get(k) == v for k, v in fields.items()),
            timeout,
        )

    def ack(self, attempt_id: str) -> dict[str, Any]:
        return self.expect(lambda m: m.get("t") == "ack" and m.get("attempt_id") == attempt_id)

    def heartbeat(self, *attempt_ids: str) -> dict[str, str]:
        self.send({"t": "hb", "attempts": list(attempt_ids)})
        reply = self.expect(lambda m: m.get("t") == "hb" and set(m["status"]) == set(attempt_ids))
        status: dict[str, str] = reply["status"]
        return status

    def done(self, attempt_id: str, result: dict[str, Any]) -> dict[str, Any]:
        self.send({"t": "done", "attempt_id": attempt_id, "result": result})
        return self.ack(attempt_id)

    def fail(self, attempt_id: str, error: RecoveryError) -> dict[str, Any]:
        self.send({"t": "fail", "attempt_id": attempt_id, "error": error.model_dump(mode="json")})
        return self.ack(attempt_id)


@contextlib.contextmanager
def connect_fake_worker(
    api: Api, worker_id: str = "w-test", agents: list[AgentSpec] | None = None, **hello: Any
) -> Iterator[FakeWorker]:
    """A connection that said hello, serving ``agents`` (default: ``AGENT``); ``hello`` adds
    fields (attempts, resume, history_cache...)."""
    with api.http.websocket_connect("/v1/workers/connect") as ws:
        fake = FakeWorker(ws)
        fake.send(
            {
                "t": "hello",
                "worker_id": worker_id,
                "agents": [
                    a.model_dump(mode="json") for a in ([AGENT] if agents is None else agents)
                ],
                "capacity": 8,
                **hello,
            }
        )
        fake.welcome = fake.expect("welcome")
        assert fake.welcome["worker_id"] == worker_id
        yield fake


@pytest.fixture
def worker(api: Api) -> Iterator[FakeWorker]:
    """A Worker connected over the real protocol, serving ``AGENT``."""
    with connect_fake_worker(api) as fake:
        yield fake


# --- test_client: a real server, a real Worker ----------------------------------------------------

charges: list[tuple[int, str, int]] = []
"""The side effects of the ``charge`` tool: (amount, idempotency key, attempt)."""


def script(history: list[Item]) -> ModelResponse:
    """ "add A B", "charge N" and "refuse WHY" call a tool; anything else is echoed.
    Once the tools have answered, the model reports their results."""
    last = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last]
    assert isinstance(user, UserItem)
    results = [item for item in history[last + 1 :] if isinstance(item, ToolResultItem)]
    if results:
        return say(
            "results: " + json.dumps([[r.name, r.status.value, r.result, r.error] for r in results])
        )
    words = user.text.split()
    if words[0] == "add":
        return ModelResponse(tool_calls=[call("add", "c1", a=int(words[1]), b=int(words[2]))])
    if words[0] == "charge":
        return ModelResponse(tool_calls=[call("charge", "c1", amount=int(words[1]))])
    if words[0] == "hold":
        return ModelResponse(tool_calls=[call("hold", "c1")])
    if words[0] == "refuse":
        return ModelResponse(tool_calls=[call("refuse", "c1", reason=" ".join(words[1:]))])
    return say(f"echo: {user.text}")


@dex.tool(kind="read")
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@dex.tool(kind="write")
async def charge(amount: int, ctx: dex.ToolContext) -> str:
    """Charge a card."""
    charges.append((amount, ctx.idempotency_key, ctx.attempt))
    return f"charged {amount}"


@dex.tool(kind="read")
def refuse(reason: str) -> str:
    """Always fails with a known outcome."""
    raise dex.ToolError(reason)


HOLD: dict[str, asyncio.Event] = {}
"""Set by a test: ``hold`` sets HOLD["entered"], then waits for HOLD["open"]."""


@dex.tool(kind="read")
async def hold() -> str:
    """Runs until the test lets it finish."""
    HOLD["entered"].set()
    await HOLD["open"].wait()
    return "released"


HELPER = dex.Agent(
    name="helper",
    model=Scripted(script),
    instructions="A test agent.",
    tools=[add, charge, refuse, hold],
    model_retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
)

FAST_WORKER = dex.WorkerConfig(
    heartbeat_interval=0.2, drain_timeout=5.0, reconnect_initial=0.02, reconnect_max=0.2
)


async def metric(address: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(address + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name} in {text!r}")


@contextlib.asynccontextmanager
async def run_server(
    data_dir: Path, *, port: int | None = None, tracer_provider: Any = None, **options: Any
) -> AsyncIterator[str]:
    """A real uvicorn server in this process, on ``port`` (default: a free one); yields its
    address."""
    port = port or free_port()
    config = ServerConfig(
        data_dir=data_dir, listen=f"127.0.0.1:{port}", **{"heartbeat_timeout": 5.0, **options}
    )
    server = uvicorn.Server(
        uvicorn.Config(
            asgi(config, tracer_provider),
            host="127.0.0.1",
            port=port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    task = asyncio.create_task(server.serve())
    address = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                if task.done():
                    task.result()
                    raise RuntimeError("the server stopped while starting")
                try:
                    async with http.get(address + "/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await wait_until_async(ready, timeout=20, what="the server answers /readyz")
        yield address
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


@pytest.fixture
async def server_address(tmp_path: Path) -> AsyncIterator[str]:
    async with run_server(tmp_path / "data") as address:
        yield address


@pytest.fixture
async def client(server_address: str) -> AsyncIterator[dex.Client]:
    async with dex.Client(server_address, timeout=15) as c:
        yield c


@pytest.fixture
async def dex_worker(server_address: str, client: dex.Client) -> AsyncIterator[dex.Worker]:
    """A real Worker serving ``HELPER``, connected and registered."""
    charges.clear()
    async with dex.Worker([HELPER], server_address, FAST_WORKER) as worker:

        async def registered() -> bool:
            return any(a["name"] == HELPER.name for a in await client.list_agents())

        await wait_until_async(registered, what="the Worker registered its agent")
        yield worker


CLIENT, WORKER, ADMIN = "client-secret", "worker-secret", "admin-secret"
"""The tokens of ``guarded``: one of each role."""


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[TestClient]:
    """An app with auth on (one token of each role), on SQLite in ``tmp_path``."""
    config = ServerConfig(
        data_dir=tmp_path, client_token=CLIENT, worker_token=WORKER, admin_token=ADMIN
    )
    with TestClient(asgi(config)) as client:
        yield client

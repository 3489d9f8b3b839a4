"""Fixtures for the model provider tests: the fake provider servers, each provider's
model pointed at them, and a real Dex Server (uvicorn) in process."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from dex.models import Anthropic, Model, ModelRequest, OpenAI
from dex.models import _translate as tr
from dex.models._sdk import SDKModel
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.testing.fake_providers import FakeAnthropic, FakeOpenAI, FakeProvider, Script
from dex.testing.wait import wait_until_async
from dex.wire import Item, ModelResponse, ToolSpec, UserItem

PROVIDERS = ["anthropic", "openai-chat", "openai-responses"]


@dataclass(frozen=True)
class Provider:
    """One provider under test: how to start its fake server and point a model at it."""

    name: str

    def server(self, script: Script, **kwargs: Any) -> FakeProvider:
        cls = FakeAnthropic if self.name == "anthropic" else FakeOpenAI
        return cls(script, **kwargs)

    def model(self, server: FakeProvider, **kwargs: Any) -> SDKModel[Any]:
        kwargs.setdefault("api_key", server.api_key)
        if self.name == "anthropic":
            return Anthropic("claude-test", base_url=server.base_url, **kwargs)
        api = self.name.removeprefix("openai-")
        return OpenAI("gpt-test", api=api, base_url=server.base_url, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> Provider:
    return Provider(request.param)


WEATHER = ToolSpec(
    name="get_weather",
    description="The forecast for a city.",
    kind="read",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


def sent_history(provider: Provider, body: dict[str, Any]) -> list[Item]:
    """The history a fake server received, read back into Dex items."""
    if provider.name == "anthropic":
        return tr.from_anthropic(body["messages"])
    if provider.name == "openai-chat":
        return tr.from_chat(body["messages"])[1]
    return tr.from_responses(body["input"])


def model_request(
    history: list[Item] | None = None, *, tools: list[ToolSpec] | None = None, attempt: int = 1
) -> ModelRequest:
    return ModelRequest(
        session_id="s_test",
        agent="weather",
        instructions="You answer questions about the weather.",
        history=history if history is not None else [UserItem(text="Weather in Paris?")],
        tools=[WEATHER] if tools is None else tools,
        attempt=attempt,
    )


async def collect(model: Model, request: ModelRequest) -> tuple[list[str], ModelResponse]:
    """The text deltas and the one final response of ``model.stream``."""
    deltas: list[str] = []
    responses: list[ModelResponse] = []
    async for event in model.stream(request):
        if isinstance(event, ModelResponse):
            responses.append(event)
        else:
            assert not responses, "a delta came after the response"
            deltas.append(event)
    assert len(responses) == 1
    return deltas, responses[0]


@pytest.fixture
async def dex_address(tmp_path: Path) -> AsyncIterator[str]:
    """A real Dex Server (uvicorn, SQLite in ``tmp_path``) in this event loop."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = ServerConfig(
        data_dir=tmp_path / "dex", listen=f"127.0.0.1:{port}", heartbeat_timeout=30.0
    )
    server = uvicorn.Server(
        uvicorn.Config(asgi(config), lifespan="on", log_level="warning", access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await wait_until_async(started, what="the Dex Server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def agent_registered(client: Any, name: str, provider: str) -> Callable[[], Any]:
    async def check() -> bool:
        agents = await client.list_agents()
        return any(a["name"] == name and a["model"]["provider"] == provider for a in agents)

    return check

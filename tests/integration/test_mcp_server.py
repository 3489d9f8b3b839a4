"""``dex mcp``: Dex's agents over MCP, driven by the official MCP client.

A real Dex server (uvicorn, in this process) and a real ``dex.Worker`` serving a scripted
agent; ``dex mcp`` runs as its own process, over stdio (started by ``stdio_client``) and
over Streamable HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

import dex
from dex.models import Scripted, call, say
from dex.models.base import ModelError
from dex.testing import free_port, wait_until_async
from dex.wire import Item, ModelResponse, RetryPolicy, ToolResultItem, Usage, UserItem
from tests.integration.conftest import ADMIN, CLIENT, FAST_WORKER, WORKER, run_server

SRC = Path(__file__).parents[2] / "src"
DOCS = Path(__file__).parents[2] / "docs" / "mcp.md"
TOOLS = {
    "list_agents",
    "start_session",
    "send_message",
    "wait_for_turn",
    "approve_tool_call",
    "deny_tool_call",
    "answer_question",
    "get_session",
    "list_inbox",
}


def script(history: list[Item]) -> ModelResponse:
    """ "delete everything" asks for delete_all (approval), "order X" for order (a
    question), "fail" fails the turn; anything else is echoed. Once the tools have
    answered, the model says how each call went."""
    last = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last]
    assert isinstance(user, UserItem)
    results = [item for item in history[last + 1 :] if isinstance(item, ToolResultItem)]
    if results:
        return say("; ".join(f"{r.name} {r.status.value}: {r.result or r.error}" for r in results))
    if user.text == "delete everything":
        return ModelResponse(tool_calls=[call("delete_all", "c1", scope="all")])
    if user.text.startswith("order "):
        return ModelResponse(tool_calls=[call("order", "c1", item=user.text.split()[1])])
    if user.text == "fail":
        raise ModelError("the provider refused the request", retryable=False)
    if user.text == "dawdle":
        return ModelResponse(tool_calls=[call("dawdle", "c1")])
    if user.text == "spend":  # uses 1,000 tokens: the next model call finds a budget used up
        response = ModelResponse(tool_calls=[call("dawdle", "c1", seconds=0)])
        response.usage = Usage(input_tokens=1_000)
        return response
    return say(f"echo: {user.text}")


@dex.tool(kind="write", approval=True)
async def delete_all(scope: str) -> str:
    """Deletes everything in scope."""
    return f"deleted {scope}"


@dex.tool(kind="idempotent_write")
async def order(item: str, ctx: dex.ToolContext) -> str:
    """Asks which size, then orders."""
    size = await ctx.ask(f"Which size of {item}?", choices=["S", "M", "L"])
    return f"ordered {item} in {size}"


@dex.tool(kind="read")
async def dawdle(seconds: float = 1.5) -> str:
    """Takes its time."""
    await asyncio.sleep(seconds)
    return "done"


CLERK = dex.Agent(
    name="clerk",
    model=Scripted(script),
    instructions="A test agent that deletes and orders.",
    tools=[delete_all, order, dawdle],
    model_retry=RetryPolicy(max_attempts=1),
)


@contextlib.asynccontextmanager
async def dex_with_worker(tmp_path: Path, **auth: Any) -> AsyncIterator[str]:
    """A Dex server with a Worker serving ``CLERK``; yields its address."""
    async with run_server(tmp_path / "data", **auth) as address:
        config = FAST_WORKER.model_copy(update={"token": auth.get("worker_token")})
        async with (
            dex.Worker([CLERK], address, config),
            dex.Client(address, token=auth.get("admin_token")) as client,
        ):

            async def registered() -> bool:
                return any(a["name"] == CLERK.name for a in await client.list_agents())

            await wait_until_async(registered, what="the Worker registered clerk")
            yield address


def env(address: str, **more: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(SRC),
        "DEX_ADDRESS": address,
        "DEX_LOG_LEVEL": "warning",
        **more,
    }


async def call_tool(mcp: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """The tool's structured answer; a tool error fails the test with its text."""
    result = await mcp.call_tool(name, arguments)
    assert not result.is_error, text_of(result)
    answer = result.structured_content
    assert answer is not None
    # The text the model reads is the same answer, as JSON.
    assert json.loads(text_of(result)) == answer
    return dict(answer)


def text_of(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_the_tools_over_stdio(tmp_path: Path) -> None:
    async with dex_with_worker(tmp_path) as address:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "dex", "mcp"], env=env(address)
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(tools) == TOOLS
            assert tools["send_message"].input_schema["required"] == ["session_id", "text"]

            (agent,) = (await call_tool(mcp, "list_agents"))["agents"]
            assert agent["name"] == "clerk" and agent["workers"] == 1
            assert {t["name"]: t["approval"] for t in agent["tools"]} == {
                "delete_all": "always",
                "order": "never",
                "dawdle": "never",
            }

            started = await call_tool(mcp, "start_session", agent="clerk", tenant="acme")
            sid = started["session_id"]
            assert started["tenant"] == "acme" and started["status"] == "idle"

            done = await call_tool(mcp, "send_message", session_id=sid, text="hello")
            assert (done["status"], done["text"], done["turn"]) == ("completed", "echo: hello", 1)

            # A turn that stops for an approval, approved: the tool runs, the turn ends.
            waiting = await call_tool(mcp, "send_message", session_id=sid, text="delete everything")
            assert waiting["status"] == "waiting" and waiting["text"] is None
            (wait,) = waiting["waiting_for"]
            assert (wait["kind"], wait["tool"], wait["arguments"]) == (
                "approval",
                "delete_all",
                {"scope": "all"},
            )
            assert "approve_tool_call" in waiting["next"]

            inbox = await call_tool(mcp, "list_inbox")
            assert [(i["session_id"], i["call_id"]) for i in inbox["items"]] == [
                (sid, wait["call_id"])
            ]
            view = await call_tool(mcp, "get_session", session_id=sid, last=2)
            assert view["status"] == "waiting" and view["tenant"] == "acme"
            assert view["current_turn"]["waiting_for"] == waiting["waiting_for"]
            assert [m["role"] for m in view["last_messages"]] == ["user", "assistant"]
            assert view["last_messages"][1]["tool_calls"] == [
                {"tool": "delete_all", "arguments": {"scope": "all"}}
            ]

            approved = await call_tool(
                mcp,
                "approve_tool_call",
                session_id=sid,
                call_id=wait["call_id"],
                arguments_hash=wait["arguments_hash"],
            )
            assert approved["status"] == "completed"
            assert approved["text"] == "delete_all succeeded: deleted all"
            assert (await call_tool(mcp, "list_inbox"))["items"] == []

            # Denied: the tool does not run, the model is told why.
            waiting = await call_tool(mcp, "send_message", session_id=sid, text="delete everything")
            denied = await call_tool(
                mcp,
                "deny_tool_call",
                session_id=sid,
                call_id=waiting["waiting_for"][0]["call_id"],
                reason="not today",
            )
            assert denied["status"] == "completed"
            assert denied["text"] == "delete_all denied: denied: not today"

            # A question, answered: the tool goes on with the answer.
            asked = await call_tool(mcp, "send_message", session_id=sid, text="order tea")
            (question,) = asked["waiting_for"]
            assert (question["kind"], question["question"], question["choices"]) == (
                "question",
                "Which size of tea?",
                ["S", "M", "L"],
            )
            answered = await call_tool(
                mcp, "answer_question", session_id=sid, call_id=question["call_id"], answer="M"
            )
            assert answered["text"] == "order succeeded: ordered tea in M"
            assert [(c["tool"], c["status"]) for c in answered["tool_calls"]] == [
                ("order", "succeeded")
            ]

            # A failed turn answers its error; the session goes on.
            failed = await call_tool(mcp, "send_message", session_id=sid, text="fail")
            assert failed["status"] == "failed"
            assert "the provider refused the request" in failed["error"]
            view = await call_tool(mcp, "get_session", session_id=sid)
            assert (view["status"], view["current_turn"]) == ("failed", None)
            assert len(view["last_messages"]) == 10 < view["history_items"]
            assert view["last_messages"][-1] == {**view["last_messages"][-1], "role": "user"}

            # A turn that takes longer than the call waits: running, then wait_for_turn.
            slow = await call_tool(
                mcp, "send_message", session_id=sid, text="dawdle", wait_seconds=0.2
            )
            assert slow["status"] == "running" and "wait_for_turn" in slow["next"]
            ended = await call_tool(mcp, "wait_for_turn", session_id=sid, turn=slow["turn"])
            assert (ended["status"], ended["text"]) == ("completed", "dawdle succeeded: done")

            # A turn that waits for its budget says so, with Dex's reason.
            async with dex.Client(address) as client:
                await client.set_budget(sid, max_tokens=500)
            budget = await call_tool(mcp, "send_message", session_id=sid, text="spend")
            assert budget["status"] == "waiting"
            (wait,) = budget["waiting_for"]
            assert wait["kind"] == "budget" and "1000" in wait["reason"].replace(",", "")
            assert "dex budget" in budget["next"]

            # Dex's errors are tool errors with Dex's message; the server goes on serving.
            unknown = await mcp.call_tool("send_message", {"session_id": "nope", "text": "hi"})
            assert unknown.is_error
            assert text_of(unknown) == (
                "Error executing tool send_message: not_found: unknown session 'nope'"
            )
            twice = await mcp.call_tool(
                "answer_question",
                {"session_id": sid, "call_id": question["call_id"], "answer": "L"},
            )
            assert twice.is_error and "answer_question: conflict: " in text_of(twice)
            missing = await mcp.call_tool("start_session", {"agent": "nobody"})
            assert missing.is_error and "start_session: not_found: " in text_of(missing)
            assert (await call_tool(mcp, "list_agents"))["agents"]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.asynccontextmanager
async def mcp_http(address: str, log: Path, **more: str) -> AsyncIterator[str]:
    """``dex mcp --transport http`` as a process; yields its URL."""
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dex",
            "mcp",
            "--transport",
            "http",
            "--port",
            str(port),
            env=env(address, **more),
            stdout=out,
            stderr=out,
        )
    try:

        async def listening() -> bool:
            if process.returncode is not None:
                raise AssertionError(f"dex mcp exited: see {log}")
            return port_open(port)

        await wait_until_async(listening, timeout=20, what="dex mcp listening")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as mcp,
    ):
        await mcp.initialize()
        yield mcp


async def test_over_http_each_client_acts_with_its_own_bearer_token(tmp_path: Path) -> None:
    auth = {"client_token": CLIENT, "worker_token": WORKER, "admin_token": ADMIN}
    async with (
        dex_with_worker(tmp_path, **auth) as address,
        mcp_http(address, tmp_path / "mcp.log") as url,  # no token of its own
    ):
        async with http_session(url, CLIENT) as mcp:
            started = await call_tool(mcp, "start_session", agent="clerk")
            done = await call_tool(mcp, "send_message", session_id=started["session_id"], text="hi")
            assert done["text"] == "echo: hi"

        for token in ("not-the-token", None):
            async with http_session(url, token) as mcp:
                refused = await mcp.call_tool("list_agents", {})
                assert refused.is_error
                assert "list_agents: unauthorized: " in text_of(refused), text_of(refused)

    # A server-side token serves clients that send none; a client's own token, when it
    # sends one, still decides (a bad one is refused, not replaced by the server's).
    async with (
        dex_with_worker(tmp_path / "2", **auth) as address,
        mcp_http(address, tmp_path / "mcp2.log", DEX_CLIENT_TOKEN=CLIENT) as url,
    ):
        async with http_session(url, None) as mcp:
            assert [a["name"] for a in (await call_tool(mcp, "list_agents"))["agents"]] == ["clerk"]
        async with http_session(url, "not-the-token") as mcp:
            refused = await mcp.call_tool("list_agents", {})
            assert refused.is_error and "unauthorized: " in text_of(refused)


async def test_the_docs_section_names_the_tools_and_its_snippets_hold() -> None:
    from dex.mcp_server import Dex, build

    section = DOCS.read_text().split("\n## Dex agents over MCP\n")[1]
    listed = {t.name for t in await build(Dex("http://127.0.0.1:1")).list_tools()}
    assert listed == TOOLS
    rows = re.findall(r"^\| (`.+?`) \|", section, re.M)
    assert {name for row in rows for name in re.findall(r"`(\w+)`", row)} == TOOLS

    (config,) = re.findall(r"```json\n(.*?)```", section, re.S)
    entry = json.loads(config)["mcpServers"]["dex"]
    assert (entry["command"], entry["args"]) == ("dex", ["mcp"])
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    compile(snippet, "mcp.md", "exec")
    assert set(re.findall(r'call_tool\(\s*"(\w+)"', snippet)) <= TOOLS
    commands = [c.strip() for c in re.findall(r"^(dex mcp[^#\n]*)", section, re.M)]
    assert commands == ["dex mcp --transport http --port 7460"]

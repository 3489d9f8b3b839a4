"""MCP servers as tool sources (``dex.mcp_tools``), against the test MCP server over stdio
and Streamable HTTP: kinds, the idempotency key in ``_meta``, error results, reconnects."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dex
from dex.mcp import IDEMPOTENCY_KEY_META, MCPConnectionLost, MCPTools, MCPUnreachable, mcp_tools
from dex.models import Scripted, say
from dex.testing import Ledger, free_port
from dex.wire import ToolKind
from tests.support.mcp_process import SERVER, MCPServerProcess


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "gates").mkdir()
    return {
        "DEX_TEST_LEDGER": str(tmp_path / "ledger.jsonl"),
        "DEX_TEST_GATES": str(tmp_path / "gates"),
        "DEX_TEST_MCP_EXTRA": str(tmp_path / "extra"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }


@pytest.fixture
def ledger(env: dict[str, str]) -> Ledger:
    return Ledger(env["DEX_TEST_LEDGER"])


@pytest.fixture
def http(env: dict[str, str], tmp_path: Path) -> Iterator[MCPServerProcess]:
    server = MCPServerProcess(env, tmp_path / "mcp.log").start()
    try:
        yield server
    finally:
        server.kill()


def stdio(
    env: dict[str, str],
    kinds: dict[str, str] | None = None,
    include: list[str] | None = None,
    prefix: str = "",
) -> MCPTools:
    """The test server over stdio: the Worker starts it."""
    return mcp_tools(
        command=[sys.executable, str(SERVER), "stdio"],
        env=env,
        kinds=kinds,
        include=include,
        prefix=prefix,
    )


def context(call_id: str = "c1", attempt: int = 1) -> dex.ToolContext:
    async def beat() -> None:
        return None

    return dex.ToolContext(
        session_id="s1",
        call_id=call_id,
        tool="t",
        idempotency_key=f"key-{call_id}",
        attempt=attempt,
        _heartbeat=beat,
    )


def kinds(tools: MCPTools) -> dict[str, ToolKind]:
    return {t.name: t.kind for t in tools.listed()}


async def test_kinds_come_from_the_annotations_over_stdio(env: dict[str, str]) -> None:
    tools = stdio(env)
    try:
        await tools.open()
        assert kinds(tools) == {
            "find": ToolKind.READ,  # readOnlyHint
            "put": ToolKind.IDEMPOTENT_WRITE,  # idempotentHint
            "send": ToolKind.WRITE,  # no hint: the safe default
            "oops": ToolKind.READ,
        }
        (find,) = [t for t in tools.listed() if t.name == "find"]
        spec = find.spec()
        assert spec.description == "Read a value."
        assert spec.parameters["required"] == ["key"]
        assert await find.invoke(context(), {"key": "a"}) == "a is A"
    finally:
        await tools.aclose()


async def test_kinds_are_overridden_by_name_and_tools_chosen(env: dict[str, str]) -> None:
    tools = stdio(
        env,
        kinds={"send": "idempotent_write", "find": "write"},
        include=["find", "send"],
        prefix="m_",
    )
    try:
        await tools.open()
        assert kinds(tools) == {"m_find": ToolKind.WRITE, "m_send": ToolKind.IDEMPOTENT_WRITE}
    finally:
        await tools.aclose()


async def test_an_override_of_a_tool_the_server_does_not_list_is_refused(
    env: dict[str, str],
) -> None:
    tools = stdio(env, kinds={"serch": "read"})
    try:
        with pytest.raises(ValueError, match=r"lists no tool named \['serch'\]"):
            await tools.open()
    finally:
        await tools.aclose()


def test_bad_arguments_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="exactly one of url"):
        mcp_tools()
    with pytest.raises(ValueError, match="exactly one of url"):
        mcp_tools(url="http://x/mcp", command=["x"])
    with pytest.raises(ValueError, match="as a list"):
        mcp_tools(command="python server.py")
    with pytest.raises(ValueError, match="http"):
        mcp_tools(url="localhost:8000")
    with pytest.raises(ValueError, match="list of tool names"):
        mcp_tools(url="http://x/mcp", include="find")
    with pytest.raises(ValueError, match="cannot be a task"):
        mcp_tools(url="http://x/mcp", kinds={"start": "task"})
    with pytest.raises(ValueError, match="is not a valid ToolKind"):
        mcp_tools(url="http://x/mcp", kinds={"x": "reed"})


async def test_every_call_carries_the_idempotency_key_in_meta(
    http: MCPServerProcess, ledger: Ledger
) -> None:
    tools = mcp_tools(url=http.url)
    try:
        await tools.open()
        (put,) = [t for t in tools.listed() if t.name == "put"]
        assert await put.invoke(context("c7", attempt=1), {"key": "k"}) == "stored k"
        assert await put.invoke(context("c7", attempt=2), {"key": "k"}) == "stored k"
    finally:
        await tools.aclose()
    assert IDEMPOTENCY_KEY_META == "dex/idempotency_key"
    assert [(e["idempotency_key"], e["call_id"], e["attempt"]) for e in ledger.entries("put")] == [
        ("key-c7", "c7", 1),
        ("key-c7", "c7", 2),
    ]


async def test_an_error_result_is_a_failed_call_the_model_sees(env: dict[str, str]) -> None:
    tools = stdio(env)
    try:
        await tools.open()
        by_name = {t.name: t for t in tools.listed()}
        with pytest.raises(dex.ToolError, match="no such thing"):
            await by_name["oops"].invoke(context(), {"reason": "no such thing"})
        with pytest.raises(dex.ToolError, match="key"):  # bad arguments: the server says so
            await by_name["find"].invoke(context(), {"kee": "a"})
    finally:
        await tools.aclose()


async def test_the_worker_reconnects_after_the_server_restarts_and_keeps_its_tool_list(
    http: MCPServerProcess, env: dict[str, str], ledger: Ledger
) -> None:
    tools = mcp_tools(url=http.url, connect_timeout=20)
    try:
        await tools.open()
        before = [t.spec() for t in tools.listed()]
        find = next(t for t in tools.listed() if t.name == "find")
        assert await find.invoke(context(), {"key": "a"}) == "a is A"

        http.kill()
        # it comes back with one tool more
        await asyncio.to_thread(Path(env["DEX_TEST_MCP_EXTRA"]).write_text, "")
        with pytest.raises(MCPConnectionLost):  # lost mid-call: the attempt fails
            await find.invoke(context("c2"), {"key": "b"})
        http.start()
        assert await find.invoke(context("c3"), {"key": "c"}) == "c is C"
        assert [t.spec() for t in tools.listed()] == before  # fixed for the process
    finally:
        await tools.aclose()
    assert [e["key"] for e in ledger.entries("find")] == ["a", "c"]
    assert len({e["pid"] for e in ledger.entries("find")}) == 2  # two server processes


async def test_an_agent_lists_a_source_s_tools_once_opened(env: dict[str, str]) -> None:
    tools = stdio(env, include=["find"])

    @dex.tool(kind="read")
    async def local() -> str:
        """Local."""
        return "here"

    agent = dex.Agent("a", Scripted(lambda h: say("hi")), tools=[tools, local])
    with pytest.raises(RuntimeError, match="not listed yet"):
        agent.spec()
    try:
        await tools.open()
        assert [t.name for t in agent.spec().tools] == ["find", "local"]
        assert agent.tool("find") is tools.listed()[0]
    finally:
        await tools.aclose()


async def test_a_write_goes_on_a_live_session_so_a_server_restart_between_calls_costs_nothing(
    http: MCPServerProcess, ledger: Ledger
) -> None:
    tools = mcp_tools(url=http.url, connect_timeout=20)
    try:
        await tools.open()
        send = next(t for t in tools.listed() if t.name == "send")
        assert await send.invoke(context("c1"), {"to": "ann"}) == "sent to ann"
        http.kill()
        http.start()
        # the write pings first, finds the old session dead, and goes on a new one
        assert await send.invoke(context("c2"), {"to": "bob"}) == "sent to bob"
    finally:
        await tools.aclose()
    assert [(e["to"], e["call_id"]) for e in ledger.entries("send")] == [
        ("ann", "c1"),
        ("bob", "c2"),
    ]


async def test_a_write_to_a_server_that_does_not_answer_did_not_run(
    http: MCPServerProcess, ledger: Ledger
) -> None:
    tools = mcp_tools(url=http.url, connect_timeout=1)
    try:
        await tools.open()
        send = next(t for t in tools.listed() if t.name == "send")
        http.kill()
        with pytest.raises(dex.ToolError) as refused:  # a known outcome: not sent
            await send.invoke(context(), {"to": "ann"})
        assert refused.value.message.startswith(dex.TOOL_CALL_NOT_RUN_ERROR_PREFIX)
        assert "unreachable" in refused.value.message
    finally:
        await tools.aclose()
    assert ledger.entries("send") == []


async def test_a_worker_whose_mcp_server_does_not_answer_does_not_start() -> None:
    tools = mcp_tools(url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=0.5)
    agent = dex.Agent("a", Scripted(lambda h: say("hi")), tools=[tools])
    worker = dex.Worker([agent], f"http://127.0.0.1:{free_port()}")
    with pytest.raises(MCPUnreachable, match=r"MCP server http://127\.0\.0\.1:\d+/mcp unreachable"):
        await worker.run()


async def test_a_worker_refuses_two_tools_of_one_agent_with_one_name(env: dict[str, str]) -> None:
    @dex.tool(kind="read")
    async def find(key: str) -> str:
        """A local tool named as one of the server's."""
        return key

    agent = dex.Agent("a", Scripted(lambda h: say("hi")), tools=[stdio(env), find])
    worker = dex.Worker([agent], f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match=r"agent 'a' has two tools named \['find'\]"):
        await worker.run()

"""The OpenAI Agents SDK adapter, offline through the real ``openai-agents`` package: a
real Dex Server in process, Workers serving an SDK agent whose model is the fake OpenAI
server (Responses, or Chat Completions), and a Client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import (
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    function_tool,
)
from openai import AsyncOpenAI

import dex
from dex.adapters.openai_agents import STATE_KEY, OpenAIAgents
from dex.models import _translate as tr
from dex.models.base import ModelRequest
from dex.testing.fake_providers import Entry, Fail, FakeOpenAI, Reply, ScriptedCall
from dex.testing.wait import wait_until_async
from dex.wire import ModelResponse, ToolCallStatus, UserItem

RUN_CONFIG = RunConfig(tracing_disabled=True)  # offline: no trace export
APIS = ["responses", "chat"]

ran: list[tuple[str, Any]] = []
"""What the tools really did, outside Dex."""


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


@dex.tool(kind="write")
async def book_table(restaurant: str, people: int, ctx: dex.ToolContext) -> str:
    """Book a table."""
    ran.append(("book_table", (restaurant, people, ctx.idempotency_key)))
    return f"booked {people} at {restaurant}"


@dex.tool(kind="write", approval=True)
async def send_money(amount: int) -> str:
    """Send money: a person approves each call."""
    ran.append(("send_money", amount))
    return f"sent {amount}"


BOTH_STARTED = asyncio.Event()
STARTED: set[str] = set()


@dex.tool(kind="read")
async def lookup(key: str) -> str:
    """Read a value; returns only once two lookups run at the same time."""
    ran.append(("lookup", key))
    STARTED.add(key)
    if len(STARTED) >= 2:
        BOTH_STARTED.set()
    await asyncio.wait_for(BOTH_STARTED.wait(), 10)
    return key.upper()


@function_tool
def clock() -> str:
    """The time: the SDK agent's own tool, run inside the segment."""
    ran.append(("clock", None))
    return "12:00"


@asynccontextmanager
async def sdk_agent(
    server: FakeOpenAI, api: str, tools: Sequence[Any] = ()
) -> AsyncIterator[SDKAgent[Any]]:
    """An SDK agent whose model is the fake server, as a user would write it."""
    client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    model: Any = (
        OpenAIResponsesModel(model="gpt-test", openai_client=client)
        if api == "responses"
        else OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)
    )
    async with client:
        yield SDKAgent(
            name="concierge",
            instructions="You book tables.",
            model=model,
            tools=[*tools],
            model_settings=ModelSettings(include_usage=True),  # Chat Completions: usage too
        )


@asynccontextmanager
async def serving(
    address: str, server: FakeOpenAI, api: str = "responses", tools: Sequence[Any] = ()
) -> AsyncIterator[dex.Client]:
    """A Worker serving ``concierge`` (a fresh SDK agent, as another host would build it)."""
    async with sdk_agent(server, api, tools) as sdk:
        agent = dex.Agent(
            name="concierge",
            model=OpenAIAgents(sdk, run_config=RUN_CONFIG),
            tools=[book_table, send_money, lookup],
            model_retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
        )
        worker = dex.Worker([agent], address, dex.WorkerConfig(drain_timeout=5.0))
        async with worker, dex.Client(address) as client:

            async def registered() -> bool:
                return any(a["name"] == "concierge" for a in await client.list_agents())

            await wait_until_async(registered, what="the agent to register")
            yield client


def outputs(server: FakeOpenAI, request: int) -> list[str]:
    """The tool outputs the model read in the fake server's ``request``-th request."""
    body = server.requests[request].body
    if "input" in body:
        return [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def steps(turn: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [s for s in turn["steps"] if s["type"] == type_]


@pytest.mark.parametrize("api", APIS)
async def test_a_deferred_write_tool_runs_once_as_its_own_step(dex_address: str, api: str) -> None:
    script = [
        Reply(
            "Booking.",
            tool_calls=[ScriptedCall("book_table", {"restaurant": "Chez Dex", "people": 2})],
        ),
        Reply("Your table is booked."),
    ]
    async with FakeOpenAI(script) as server, serving(dex_address, server, api) as client:
        session = (await client.create_session("concierge"))["id"]
        turn = await client.send_message(session, "A table for two", wait=True, timeout=60)
        snapshot = await client.get_agent_snapshot(session)

    assert turn["status"] == "completed", turn
    assert turn["text"] == "Your table is booked."
    [call] = turn["tool_calls"]
    assert (call["name"], call["arguments"], call["status"]) == (
        "book_table",
        {"restaurant": "Chez Dex", "people": 2},
        "succeeded",
    )
    assert ran == [("book_table", ("Chez Dex", 2, call["idempotency_key"]))]
    # a write runs as a single-attempt Step of its own, between two segments
    assert [s["type"] for s in turn["steps"]] == ["RunModel", "CallSingleAttemptTool", "RunModel"]
    # the second segment resumed the SDK run: the model read Dex's recorded result
    assert len(server.requests) == 2
    assert outputs(server, 1) == [json.dumps("booked 2 at Chez Dex")]
    # the RunState is stored in the history, where any Worker can read it
    first = snapshot["history"][1]
    assert first["type"] == "assistant" and first["text"] == "Booking."
    assert first["state"][STATE_KEY]["run_state"]["current_agent"]["name"] == "concierge"
    assert "state" not in snapshot["history"][-1]  # the final answer needs none
    assert [s["usage"] for s in steps(turn, "RunModel")] == [
        {"input_tokens": 21, "output_tokens": 13},
        {"input_tokens": 21, "output_tokens": 13},
    ]


async def test_parallel_calls_run_as_parallel_steps(dex_address: str) -> None:
    BOTH_STARTED.clear()
    STARTED.clear()
    script = [
        Reply(
            tool_calls=[
                ScriptedCall("lookup", {"key": "a"}, id="call_a"),
                ScriptedCall("lookup", {"key": "b"}, id="call_b"),
            ]
        ),
        Reply("A and B."),
    ]
    async with FakeOpenAI(script) as server, serving(dex_address, server) as client:
        session = (await client.create_session("concierge"))["id"]
        turn = await client.send_message(session, "a and b?", wait=True, timeout=60)

    assert turn["status"] == "completed", turn
    # each lookup returns only once both run: they ran at the same time, as two Steps
    assert [(c["model_call_id"], c["status"], c["result"]) for c in turn["tool_calls"]] == [
        ("call_a", "succeeded", "A"),
        ("call_b", "succeeded", "B"),
    ]
    assert [s["type"] for s in turn["steps"]] == ["RunModel", "CallTool", "CallTool", "RunModel"]
    assert sorted(outputs(server, 1)) == ['"A"', '"B"']


async def test_an_inline_tool_runs_again_when_its_segment_repeats(dex_address: str) -> None:
    """The SDK agent's own tool cannot be deferred: it runs inside RunModel, so a failed
    attempt that already ran it runs it again (at-least-once)."""
    script: list[Entry] = [
        Reply(tool_calls=[ScriptedCall("clock", {}, id="call_clock")]),
        Fail(503, "overloaded"),  # the segment's second model call: the attempt fails
        Reply(tool_calls=[ScriptedCall("clock", {}, id="call_clock")]),
        Reply("It is noon."),
    ]
    async with (
        FakeOpenAI(script) as server,
        serving(dex_address, server, tools=[clock]) as client,
    ):
        session = (await client.create_session("concierge"))["id"]
        turn = await client.send_message(session, "what time is it?", wait=True, timeout=60)

    assert turn["status"] == "completed", turn
    assert turn["text"] == "It is noon."
    assert ran == [("clock", None), ("clock", None)]  # once per attempt of the segment
    [model] = steps(turn, "RunModel")
    assert [a["outcome"] for a in model["attempts"]] == ["failed", "succeeded"]
    assert "HTTP 503 (retryable)" in model["attempts"][0]["error"]["message"]
    assert turn["tool_calls"] == []  # Dex saw no tool call: the SDK ran it


async def test_a_segment_resumes_on_another_worker(dex_address: str) -> None:
    script = [
        Reply(tool_calls=[ScriptedCall("send_money", {"amount": 5}, id="call_pay")]),
        Reply("Sent."),
    ]
    async with FakeOpenAI(script) as server:
        async with serving(dex_address, server) as client:
            session = (await client.create_session("concierge"))["id"]
            turn_number = (await client.send_message(session, "pay 5"))["turn"]

            async def waiting() -> list[dict[str, Any]]:
                return await client.list_approvals(session)

            [approval] = await wait_until_async(waiting, what="the call waits for approval")
        # the first Worker is gone; a second one, with SDK objects of its own, resumes
        async with serving(dex_address, server) as client:
            await client.approve(session, approval["call_id"], by="alice")
            turn = await client.wait_turn(session, turn_number, timeout=60)

    assert turn["status"] == "completed", turn
    assert turn["text"] == "Sent."
    assert ran == [("send_money", 5)]
    assert outputs(server, 1) == [json.dumps("sent 5")]
    first, second = steps(turn, "RunModel")
    assert first["attempts"][0]["worker_id"] != second["attempts"][0]["worker_id"]


async def test_a_denied_call_reaches_the_model_as_denied(dex_address: str) -> None:
    script = [
        Reply(tool_calls=[ScriptedCall("send_money", {"amount": 900}, id="call_pay")]),
        Reply("I could not send it."),
    ]
    async with FakeOpenAI(script) as server, serving(dex_address, server) as client:
        session = (await client.create_session("concierge"))["id"]
        turn_number = (await client.send_message(session, "pay 900"))["turn"]

        async def waiting() -> list[dict[str, Any]]:
            return await client.list_approvals(session)

        [approval] = await wait_until_async(waiting, what="the call waits for approval")
        await client.deny(session, approval["call_id"], "too much")
        turn = await client.wait_turn(session, turn_number, timeout=60)

    assert turn["status"] == "completed", turn
    assert ran == []
    [call] = turn["tool_calls"]
    assert call["status"] == ToolCallStatus.DENIED
    # the SDK run was resumed with the call rejected: the model reads what any Dex model
    # reads for a denied call, the status and the reason
    [output] = outputs(server, 1)
    assert output == f"denied: {call['error']}" and output.endswith("too much")


async def test_a_new_turn_starts_from_the_dex_history() -> None:
    script = [Reply("Still booked.")]
    async with FakeOpenAI(script) as server, sdk_agent(server, "responses") as sdk:
        model = OpenAIAgents(sdk, run_config=RUN_CONFIG)
        history = [
            UserItem(text="book"),
            *tr.from_responses(
                [
                    {
                        "type": "function_call",
                        "call_id": "c1",
                        "name": "book_table",
                        "arguments": "{}",
                    },
                    {"type": "function_call_output", "call_id": "c1", "output": '"booked"'},
                    {"role": "assistant", "content": "Booked."},
                ]
            ),
            UserItem(text="is it booked?"),
        ]
        request = ModelRequest("s", "concierge", "", history, [book_table.spec()], 1)
        events = [e async for e in model.stream(request)]

    assert events[-1] == ModelResponse(text="Still booked.", usage=events[-1].usage)  # type: ignore[union-attr]
    sent = server.requests[0].body["input"]
    assert tr.from_responses(sent) == history


async def test_a_tool_both_sides_define_is_refused_without_a_model_call() -> None:
    @function_tool(name_override="book_table")
    def double() -> str:
        return "no"

    async with FakeOpenAI([]) as server, sdk_agent(server, "responses", [double]) as sdk:
        model = OpenAIAgents(sdk, run_config=RUN_CONFIG)
        request = ModelRequest("s", "concierge", "", [UserItem(text="hi")], [book_table.spec()], 1)
        with pytest.raises(dex.DexError, match=r"both define the tool\(s\) \['book_table'\]") as e:
            async for _ in model.stream(request):
                pass
    assert e.value.retryable is False
    assert server.requests == []


async def test_a_summary_asks_the_sdk_agents_model_without_tools() -> None:
    async with (
        FakeOpenAI([Reply("They booked a table.")]) as server,
        sdk_agent(server, "responses", [clock]) as sdk,
    ):
        model = OpenAIAgents(sdk, run_config=RUN_CONFIG)
        request = ModelRequest(
            "s", "concierge", "", [UserItem(text="book a table")], [book_table.spec()], 1
        )
        summary = await model.summarize(request)

    assert summary.text == "They booked a table."
    assert summary.usage.input_tokens == 21
    [sent] = server.requests
    assert not sent.body.get("tools")
    assert sent.body["instructions"].startswith("You compress conversations.")
    assert sent.body["input"][-1]["content"] == "Summarize the conversation so far, as instructed."


async def test_an_sdk_tool_that_needs_approval_is_refused_not_run() -> None:
    @function_tool(needs_approval=True)
    def wire_money(amount: int) -> str:
        """Not a Dex tool, yet it wants approval."""
        ran.append(("wire_money", amount))
        return "wired"

    script = [Reply(tool_calls=[ScriptedCall("wire_money", {"amount": 3})])]
    async with FakeOpenAI(script) as server, sdk_agent(server, "responses", [wire_money]) as sdk:
        model = OpenAIAgents(sdk, run_config=RUN_CONFIG)
        request = ModelRequest("s", "concierge", "", [UserItem(text="wire")], [], 1)
        with pytest.raises(dex.DexError, match=r"tool 'wire_money' asked for approval") as e:
            async for _ in model.stream(request):
                pass
    assert e.value.retryable is False
    assert ran == []

"""The Claude Agent SDK adapter, offline through the real ``claude-agent-sdk`` package and
its bundled Claude Code CLI, pointed at the fake Anthropic server (Messages with SSE); a
real Dex Server in process, Workers and a Client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions

import dex
from dex.adapters.claude_agent_sdk import STATE_KEY, ClaudeAgent
from dex.models import _translate as tr
from dex.models.base import ModelRequest
from dex.testing.fake_providers import Entry, Fail, FakeAnthropic, Reply, ScriptedCall
from dex.testing.wait import wait_until_async
from dex.wire import UserItem

ran: list[tuple[str, Any]] = []
"""What the Dex tools really did, outside Dex."""


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


@dex.tool(kind="write")
async def book_table(restaurant: str, people: int) -> str:
    """Book a table."""
    ran.append(("book_table", (restaurant, people)))
    return f"booked {people} at {restaurant}"


@dex.tool(kind="write", approval=True)
async def send_money(amount: int) -> str:
    """Send money: a person approves each call."""
    ran.append(("send_money", amount))
    return f"sent {amount}"


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last message."""
    content = body["messages"][-1]["content"]
    blocks = content if isinstance(content, list) else []
    return [b for b in blocks if b.get("type") == "tool_result"]


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content)


def calling(*calls: ScriptedCall, then: Callable[[list[dict[str, Any]]], Entry]) -> Any:
    """A fake model: ``calls`` first; once tool results arrive, ``then(results)``."""

    def script(body: dict[str, Any]) -> Entry:
        results = tool_results(body)
        if not results:
            return Reply("Let me do that.", tool_calls=list(calls))
        return then(results)

    return script


@asynccontextmanager
async def serving(
    address: str, server: FakeAnthropic, tmp_path: Path, **options: Any
) -> AsyncIterator[dex.Client]:
    """A Worker serving ``coder``, whose CLI talks to the fake server only."""
    model = ClaudeAgent(
        ClaudeAgentOptions(
            model="claude-sonnet-4-5",
            cwd=str(tmp_path),
            max_turns=8,
            env={"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": server.api_key or ""},
            **options,
        )
    )
    agent = dex.Agent(
        name="coder",
        model=model,
        tools=[book_table, send_money],
        model_retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
    )
    worker = dex.Worker([agent], address, dex.WorkerConfig(drain_timeout=5.0))
    async with worker, dex.Client(address) as client:

        async def registered() -> bool:
            return any(a["name"] == "coder" for a in await client.list_agents())

        await wait_until_async(registered, what="the agent to register")
        yield client


def step_types(turn: dict[str, Any]) -> list[str]:
    return [s["type"] for s in turn["steps"]]


async def test_a_deferred_write_tool_runs_once_as_its_own_step(
    dex_address: str, tmp_path: Path
) -> None:
    seen: list[str] = []

    def then(results: list[dict[str, Any]]) -> Entry:
        seen.extend(result_text(r) for r in results)
        return Reply("Your table is booked.")

    script = calling(
        ScriptedCall("mcp__dex__book_table", {"restaurant": "Chez Dex", "people": 2}), then=then
    )
    async with FakeAnthropic(script) as server, serving(dex_address, server, tmp_path) as client:
        session = (await client.create_session("coder"))["id"]
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
    assert ran == [("book_table", ("Chez Dex", 2))]
    assert step_types(turn) == ["RunModel", "CallSingleAttemptTool", "RunModel"]
    # the model was given the Dex tool with its schema (not behind tool search)
    [offered] = [t for t in server.requests[0].body["tools"] if t["name"] == "mcp__dex__book_table"]
    assert offered["input_schema"]["required"] == ["restaurant", "people"]
    # the resumed session answered the deferred call with what Dex recorded
    assert seen == [json.dumps("booked 2 at Chez Dex")]
    first = snapshot["history"][1]
    assert first["type"] == "assistant" and first["text"] == "Let me do that."
    saved = first["state"][STATE_KEY]
    assert saved["deferred"] == call["model_call_id"] and saved["transcript"]
    # each segment forks a fresh session
    last = snapshot["history"][-1]["state"][STATE_KEY]
    assert last["session_id"] != saved["session_id"] and "deferred" not in last


async def test_parallel_calls_run_one_per_segment_and_none_is_dropped(
    dex_address: str, tmp_path: Path
) -> None:
    """The CLI keeps only the last deferred call of a response: the adapter defers the
    first, tells the model the others did not run, and the model calls them again."""
    seen: list[list[tuple[str, bool]]] = []

    def script(body: dict[str, Any]) -> Entry:
        results = tool_results(body)
        if not results:
            return Reply(
                tool_calls=[
                    ScriptedCall("mcp__dex__book_table", {"restaurant": "A", "people": 1}),
                    ScriptedCall("mcp__dex__book_table", {"restaurant": "B", "people": 2}),
                ]
            )
        seen.append([(result_text(r), bool(r.get("is_error"))) for r in results])
        if len(seen) == 1:
            return Reply(
                tool_calls=[ScriptedCall("mcp__dex__book_table", {"restaurant": "B", "people": 2})]
            )
        return Reply("Both booked.")

    async with FakeAnthropic(script) as server, serving(dex_address, server, tmp_path) as client:
        session = (await client.create_session("coder"))["id"]
        turn = await client.send_message(session, "book A and B", wait=True, timeout=60)

    assert turn["status"] == "completed", turn
    assert ran == [("book_table", ("A", 1)), ("book_table", ("B", 2))]
    assert [(c["arguments"]["restaurant"], c["status"]) for c in turn["tool_calls"]] == [
        ("A", "succeeded"),
        ("B", "succeeded"),
    ]
    first, second = seen
    # the model read a result for both calls of its first response: the first ran, the
    # second did not, and says so
    refused, booked = first
    assert booked == (json.dumps("booked 1 at A"), False)
    assert refused[1] is True
    assert (
        f"{dex.TOOL_CALL_NOT_RUN_ERROR_PREFIX}: Dex runs one call of its tools at a time"
        in (refused[0])
    )
    assert second == [(json.dumps("booked 2 at B"), False)]


async def test_a_built_in_tool_runs_again_when_its_segment_repeats(
    dex_address: str, tmp_path: Path
) -> None:
    """Bash runs inside the CLI, inside RunModel: an attempt that fails after it ran runs
    it again (at-least-once)."""
    marks = tmp_path / "marks.txt"
    answers: list[Entry] = [Fail(500, "overloaded"), Reply("Done.")]

    def script(body: dict[str, Any]) -> Entry:
        if not tool_results(body):
            command = f"echo ran >> {marks}"
            return Reply(tool_calls=[ScriptedCall("Bash", {"command": command})])
        return answers.pop(0)

    async with (
        FakeAnthropic(script) as server,
        serving(
            dex_address,
            server,
            tmp_path,
            allowed_tools=["Bash"],
        ) as client,
    ):
        session = (await client.create_session("coder"))["id"]
        turn = await client.send_message(session, "mark it", wait=True, timeout=60)

    assert turn["status"] == "completed", turn
    assert marks.read_text().splitlines() == ["ran", "ran"]  # once per attempt
    [model] = [s for s in turn["steps"] if s["type"] == "RunModel"]
    assert [a["outcome"] for a in model["attempts"]] == ["failed", "succeeded"]
    assert "HTTP 500" in model["attempts"][0]["error"]["message"]
    assert turn["tool_calls"] == []


async def test_a_segment_resumes_on_another_worker(dex_address: str, tmp_path: Path) -> None:
    seen: list[str] = []

    def then(results: list[dict[str, Any]]) -> Entry:
        seen.extend(result_text(r) for r in results)
        return Reply("Sent.")

    pay = calling(ScriptedCall("mcp__dex__send_money", {"amount": 5}), then=then)

    def script(body: dict[str, Any]) -> Entry:
        if "thanks" in json.dumps(body["messages"][-1]):
            return Reply("You're welcome.")
        return pay(body)  # type: ignore[no-any-return]

    async with FakeAnthropic(script) as server:
        async with serving(dex_address, server, tmp_path) as client:
            session = (await client.create_session("coder"))["id"]
            turn_number = (await client.send_message(session, "pay 5"))["turn"]

            async def waiting() -> list[dict[str, Any]]:
                return await client.list_approvals(session)

            [approval] = await wait_until_async(waiting, 30, what="the call waits for approval")
        # the first Worker is gone; a second one resumes the session from Dex's history
        async with serving(dex_address, server, tmp_path) as client:
            await client.approve(session, approval["call_id"], by="alice")
            turn = await client.wait_turn(session, turn_number, timeout=60)
            # the next turn resumes the session the last segment left
            again = await client.send_message(session, "thanks", wait=True, timeout=60)

    assert turn["status"] == "completed", turn
    assert turn["text"] == "Sent."
    assert ran == [("send_money", 5)]
    assert seen == [json.dumps("sent 5")]
    first, second = [s for s in turn["steps"] if s["type"] == "RunModel"]
    assert first["attempts"][0]["worker_id"] != second["attempts"][0]["worker_id"]
    assert again["status"] == "completed", again
    prompts = [m for r in server.requests for m in r.body["messages"] if m["role"] == "user"]
    assert any("thanks" in json.dumps(m) for m in prompts)
    assert "pay 5" in json.dumps(server.requests[-1].body["messages"])  # the context came along


async def test_a_summary_asks_the_model_without_tools(tmp_path: Path) -> None:
    async with FakeAnthropic([Reply("They booked a table.")]) as server:
        model = ClaudeAgent(
            ClaudeAgentOptions(
                model="claude-sonnet-4-5",
                cwd=str(tmp_path),
                allowed_tools=["Bash"],
                env={
                    "ANTHROPIC_BASE_URL": server.base_url,
                    "ANTHROPIC_API_KEY": server.api_key or "",
                },
            )
        )
        request = ModelRequest(
            "s", "coder", "", [UserItem(text="book a table for two")], [book_table.spec()], 1
        )
        summary = await model.summarize(request)

    assert summary.text == "They booked a table."
    [sent] = server.requests
    assert not sent.body.get("tools")
    assert "You compress conversations." in json.dumps(sent.body["system"])
    assert "book a table for two" in json.dumps(sent.body["messages"])


async def test_a_turn_cancelled_at_a_deferred_call_leaves_the_next_turn_sound(
    dex_address: str, tmp_path: Path
) -> None:
    """The next turn resumes a session whose last segment ended at a deferred call: the
    CLI finishes that call first, with what Dex recorded, and never runs the tool."""

    def script(body: dict[str, Any]) -> Entry:
        last = json.dumps(body["messages"][-1])
        if "thanks" in last:
            return Reply("You're welcome.")
        if tool_results(body):
            return Reply("Noted.")
        return Reply(tool_calls=[ScriptedCall("mcp__dex__send_money", {"amount": 9})])

    async with FakeAnthropic(script) as server, serving(dex_address, server, tmp_path) as client:
        session = (await client.create_session("coder"))["id"]
        first = (await client.send_message(session, "pay 9"))["turn"]

        async def waiting() -> list[dict[str, Any]]:
            return await client.list_approvals(session)

        await wait_until_async(waiting, 30, what="the call waits for approval")
        await client.cancel_turn(session)
        cancelled = await client.wait_turn(session, first, timeout=30)
        turn = await client.send_message(session, "thanks", wait=True, timeout=60)
        messages = [m for r in server.requests for m in r.body["messages"]]

    assert cancelled["status"] == "cancelled", cancelled
    assert turn["status"] == "completed", turn
    assert ran == []  # the cancelled call never ran, and resuming did not run it
    [call] = cancelled["tool_calls"]
    # the CLI's model read a result for the call before the new message: as with any Dex
    # model, a cancelled turn's call without a result in the history reads as unknown
    results = [
        (result_text(b), bool(b.get("is_error")))
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert results and set(results) == {(f"outcome_unknown: {tr.MISSING_RESULT}", True)}
    assert call["status"] == "failed" and call["error"].startswith(
        dex.TOOL_CALL_NOT_RUN_ERROR_PREFIX
    )


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (ClaudeAgentOptions(resume="abc"), "resume, continue_conversation and session_store"),
        (ClaudeAgentOptions(mcp_servers={"dex": {"type": "stdio", "command": "x"}}), "Dex's"),
        (ClaudeAgentOptions(mcp_servers="servers.json"), "as a dict"),
    ],
)
def test_options_that_would_fight_dex_are_refused(options: Any, problem: str) -> None:
    with pytest.raises((ValueError, TypeError), match=problem):
        ClaudeAgent(options)

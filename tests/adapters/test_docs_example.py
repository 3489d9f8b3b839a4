"""The examples of docs/agent-frameworks.md run as they are written, with ``dex worker``:
a real server and Worker process, the SDK pointed at a fake provider server by the
environment alone."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dex.testing.fake_providers import Entry, FakeAnthropic, FakeOpenAI, Reply, ScriptedCall
from tests.support.rig import Rig

DOC = Path(__file__).parents[2] / "docs" / "agent-frameworks.md"


def example(heading: str) -> str:
    """The first Python block after ``heading`` in the page."""
    text = DOC.read_text()
    section = text[text.index(heading) :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, f"no python example under {heading!r}"
    return found.group(1)


def concierge(body: dict[str, Any]) -> Entry:
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if not outputs:
        return Reply(
            tool_calls=[ScriptedCall("find_restaurant", {"cuisine": "french"}, id="call_find")]
        )
    if len(outputs) == 1:
        return Reply(
            tool_calls=[
                ScriptedCall("opening_hours", {"restaurant": "Chez Dex"}, id="call_hours"),
                ScriptedCall("book_table", {"restaurant": "Chez Dex", "people": 2}, id="call_b"),
            ]
        )
    return Reply("Booked: " + json.dumps([o["output"] for o in outputs]))


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(concierge).in_thread() as server:
        yield server


def test_the_openai_agents_example_runs_with_dex_worker(model: FakeOpenAI, tmp_path: Path) -> None:
    module = tmp_path / "concierge.py"
    module.write_text(example("## OpenAI Agents SDK"))
    rig = Rig(tmp_path)  # made once the fake model listens, so its port is free
    try:
        rig.start_server()
        rig.start_worker(
            module=str(module),
            env={
                "OPENAI_BASE_URL": model.base_url,
                "OPENAI_API_KEY": model.api_key or "",
                "OPENAI_AGENTS_DISABLE_TRACING": "1",
            },
        )
        session = rig.session("concierge")
        turn = rig.client.send_message(session, "a table for two, french", wait=True)
    finally:
        rig.close()

    assert turn["status"] == "completed", turn
    assert [(c["name"], c["status"]) for c in turn["tool_calls"]] == [
        ("find_restaurant", "succeeded"),
        ("book_table", "succeeded"),
    ]
    # the SDK's own tool ran inline; the Dex tools' results came from Dex
    assert json.loads(turn["text"].removeprefix("Booked: ")) == [
        '["Chez Dex"]',
        "Chez Dex is open 12:00-23:00",
        '"booked 2 at Chez Dex"',
    ]
    assert [s["type"] for s in turn["steps"]] == [
        "RunModel",
        "CallTool",
        "RunModel",
        "CallSingleAttemptTool",
        "RunModel",
    ]


def triage(body: dict[str, Any]) -> Entry:
    content = body["messages"][-1]["content"]
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    calls = [
        b["name"]
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    if not calls:
        return Reply(tool_calls=[ScriptedCall("mcp__dex__find_tickets", {"query": "crash"})])
    if len(calls) == 1 and results:
        return Reply(tool_calls=[ScriptedCall("mcp__dex__open_ticket", {"title": "Crash"})])
    return Reply("Opened a ticket.")


def test_the_claude_agent_sdk_example_runs_with_dex_worker(tmp_path: Path) -> None:
    module = tmp_path / "triage.py"
    module.write_text(example("## Claude Agent SDK"))
    with FakeAnthropic(triage).in_thread() as model:
        rig = Rig(tmp_path)  # made once the fake model listens, so its port is free
        try:
            rig.start_server()
            rig.start_worker(
                module=str(module),
                env={
                    "ANTHROPIC_BASE_URL": model.base_url,
                    "ANTHROPIC_API_KEY": model.api_key or "",
                },
            )
            session = rig.session("triage")
            turn = rig.client.send_message(session, "the app crashes on start", wait=True)
        finally:
            rig.close()

    assert turn["status"] == "completed", turn
    assert turn["text"] == "Opened a ticket."
    assert [(c["name"], c["status"], c["result"]) for c in turn["tool_calls"]] == [
        ("find_tickets", "succeeded", []),
        ("open_ticket", "succeeded", "opened 'Crash'"),
    ]
    assert [s["type"] for s in turn["steps"]] == [
        "RunModel",
        "CallTool",
        "RunModel",
        "CallSingleAttemptTool",
        "RunModel",
    ]

"""An OpenAI Agents SDK agent on Dex, for crash tests in real Worker processes.

Its model is the real SDK's Responses model pointed at a fake OpenAI server
(``DEX_TEST_PROVIDER_URL``, ``DEX_TEST_PROVIDER_KEY``) whose script is ``script`` below:
the user message ``call: [[tool, {args}], ...]`` asks for those calls in one response;
once every call has its output, the model answers ``results: <json of the outputs>``.

``charge`` (write), ``upsert`` (idempotent write) and ``lookup`` (read) are Dex tools: Dex
runs them as Steps. ``clock`` is the SDK agent's own function tool: it runs inside the
segment. Every tool records its effect in the ledger (``DEX_TEST_LEDGER``); with a
``gate`` it writes ``<gate>.<n>.entered`` (n: the attempt, or for ``clock`` its n-th run)
and waits for ``<gate>.open`` (``DEX_TEST_GATES``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import OpenAIResponsesModel, RunConfig, function_tool
from openai import AsyncOpenAI

import dex
from dex.adapters.openai_agents import OpenAIAgents
from dex.testing import Gates, Ledger
from dex.testing.fake_providers import Entry, Reply, ScriptedCall

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))
GATES = Path(os.environ.get("DEX_TEST_GATES", "."))
GATE = Gates(GATES)
_FAST = dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05)


def script(body: dict[str, Any]) -> Entry:
    """The fake model: a function of the request, so a repeated segment gets the same."""
    items: list[dict[str, Any]] = body["input"]
    last_user = max(i for i, item in enumerate(items) if item.get("role") == "user")
    asked = json.loads(items[last_user]["content"].removeprefix("call:"))
    after = items[last_user + 1 :]
    outputs = {i["call_id"]: i["output"] for i in after if i.get("type") == "function_call_output"}
    if not outputs:
        return Reply(
            tool_calls=[
                ScriptedCall(name, arguments, id=f"call_{n}")
                for n, (name, arguments) in enumerate(asked)
            ]
        )
    return Reply("results: " + json.dumps([outputs[f"call_{n}"] for n in range(len(asked))]))


@dex.tool(kind="write")
async def charge(amount: int, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Charge a card: not idempotent, so Dex runs it at most once."""
    LEDGER.record("charge", amount=amount, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"charged {amount}"


@dex.tool(kind="idempotent_write", retry=_FAST)
async def upsert(key: str, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Write a record keyed by the idempotency key."""
    LEDGER.record("upsert", key=key, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"stored {key}"


@function_tool
async def clock(gate: str | None = None) -> str:
    """The time. The SDK agent's own tool: it runs inside the segment."""
    LEDGER.record("clock")
    await GATE.wait(gate, len(LEDGER.entries("clock")))
    return "12:00"


_client = AsyncOpenAI(
    base_url=os.environ.get("DEX_TEST_PROVIDER_URL", "http://127.0.0.1:9"),
    api_key=os.environ.get("DEX_TEST_PROVIDER_KEY", "test-key"),
    max_retries=0,
)
_sdk_agent = SDKAgent(
    name="framework",
    instructions="You are a test agent.",
    model=OpenAIResponsesModel(model="gpt-test", openai_client=_client),
    tools=[clock],
)

framework = dex.Agent(
    name="framework",
    model=OpenAIAgents(_sdk_agent, run_config=RunConfig(tracing_disabled=True)),
    tools=[charge, upsert],
    model_retry=_FAST,
)

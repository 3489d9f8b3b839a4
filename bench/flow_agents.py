"""The agents of ``bench.flow``; its Workers load this module (``dex worker
bench/flow_agents.py``).

``bench`` is the turn benchmark's agent (``bench/agents.py``: model -> one ``read`` tool
-> model, no-op bodies) with a concurrency key on its tool, for the side of the admission
figure that has limits. ``flow`` answers each message with one model call to the
Anthropic Messages API through the real SDK client, at the fake server whose address is
``DEX_BENCH_PROVIDER``; its calls count against the model group ``flow``.
"""

from __future__ import annotations

import os

import dex
from dex.models import Anthropic, Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem

GROUP = "flow"
"""The model group of ``flow``'s model."""
TOOL_LIMIT = 1_000
"""``read``'s calls at once under one key: more than the benchmark ever runs."""


def respond(history: list[Item]) -> ModelResponse:
    """As ``bench/agents.py``: ask for ``read`` after a user message; answer after its
    result."""
    if history and isinstance(history[-1], ToolResultItem):
        return say("done")
    return ModelResponse(tool_calls=[call("read", "c1", key="k")], stop_reason="tool_use")


@dex.tool(kind="read", concurrency_key="{key}", concurrency_limit=TOOL_LIMIT)
async def read(key: str) -> str:
    """Return the key: a tool that does nothing, whose calls count against its key."""
    return key


bench = dex.Agent(name="bench", model=Scripted(respond), instructions="Benchmark.", tools=[read])

flow = dex.Agent(
    name="flow",
    model=Anthropic(
        "claude-flow",
        base_url=os.environ.get("DEX_BENCH_PROVIDER", "http://127.0.0.1:9"),
        api_key="test-key",
        max_tokens=64,
        timeout=30.0,
        group=GROUP,
    ),
    instructions="Benchmark.",
)

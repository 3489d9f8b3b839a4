"""The benchmark's agent. One turn is model -> one ``read`` tool -> model, with no-op bodies.

The scripted model asks for the tool when the newest history item is the user's
message and answers once the tool's result is there, so every turn is exactly
three Steps: ``RunModel``, ``CallTool``, ``RunModel``. The Worker loads this
module (``dex worker bench/agents.py``); ``bench.turns`` also calls the same
functions directly to measure the in-process floor.
"""

from __future__ import annotations

import dex
from dex.models import Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem


def respond(history: list[Item]) -> ModelResponse:
    """Ask for ``read`` after a user message; answer after its result."""
    if history and isinstance(history[-1], ToolResultItem):
        return say("done")
    return ModelResponse(tool_calls=[call("read", "c1", key="k")], stop_reason="tool_use")


@dex.tool(kind="read")
async def read(key: str) -> str:
    """Return the key: a tool that does nothing."""
    return key


bench = dex.Agent(name="bench", model=Scripted(respond), instructions="Benchmark.", tools=[read])

"""The growth benchmark's agent: a turn of N ``read`` calls, one after another.

The user's message is a number N. The scripted model asks for ``read`` until the turn
holds N tool results, then answers: a turn of 2N + 1 Steps (N+1 ``RunModel``, N
``CallTool``). The Worker loads this module (``dex worker bench/growth_agents.py``).
"""

from __future__ import annotations

import dex
from dex.models import Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem, UserItem


def respond(history: list[Item]) -> ModelResponse:
    """Call ``read`` until this turn has as many results as the user's message says."""
    results = 0
    for item in reversed(history):
        if isinstance(item, UserItem):
            wanted = int(item.text)
            break
        results += isinstance(item, ToolResultItem)
    else:
        wanted = 0
    if results >= wanted:
        return say("done")
    return ModelResponse(tool_calls=[call("read", f"c{results}", key="k")], stop_reason="tool_use")


@dex.tool(kind="read")
async def read(key: str) -> str:
    """Return the key: a tool that does nothing."""
    return key


growth = dex.Agent(name="growth", model=Scripted(respond), instructions="Benchmark.", tools=[read])

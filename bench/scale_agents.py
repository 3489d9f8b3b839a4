"""The agent ``bench.scale`` runs. A user message ``hold`` asks for the ``hold`` tool,
whose first attempt records its start and blocks (until Dex cancels it); a later attempt
records its start and returns at once. Any other message is answered without a tool.

Starts go to ``$DEX_BENCH_DIR/starts.jsonl`` (one line per attempt: session, attempt,
time), the tool's own ledger outside Dex.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import dex
from dex.models import Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem, UserItem

LEDGER = Path(os.environ.get("DEX_BENCH_DIR", ".")) / "starts.jsonl"


@dex.tool(kind="read")
async def hold(ctx: dex.ToolContext) -> str:
    """Record a start; the first attempt then blocks until it is cancelled."""
    line = {"session": ctx.session_id, "attempt": ctx.attempt, "at": time.time()}
    with LEDGER.open("a") as f:
        f.write(json.dumps(line) + "\n")
    if ctx.attempt == 1:
        await asyncio.Event().wait()  # only a cancel (the server's restart) ends it
    return "held"


def script(history: list[Item]) -> ModelResponse:
    last = history[-1]
    if isinstance(last, ToolResultItem):
        return say("done")
    if isinstance(last, UserItem) and last.text == "hold":
        return ModelResponse(tool_calls=[call("hold", "c1")], stop_reason="tool_use")
    return say("hello")


scale = dex.Agent(name="scale", model=Scripted(script), instructions="Scale.", tools=[hold])

"""The agent ``bench.recovery`` runs: one ``read`` tool that records when it starts (with
its attempt and the Worker's pid) and then blocks until the benchmark releases it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import dex
from dex.models import Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem

DIR = Path(os.environ.get("DEX_BENCH_DIR", "."))


@dex.tool(kind="read")
async def hold(run: int, ctx: dex.ToolContext) -> str:
    """Record a start, then hold until released."""
    line = {"run": run, "attempt": ctx.attempt, "pid": os.getpid(), "at": time.time()}
    with (DIR / "starts.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    while not (DIR / f"release-{run}").exists():
        await asyncio.sleep(0.005)
    return "released"


def script(history: list[Item]) -> ModelResponse:
    if isinstance(history[-1], ToolResultItem):
        return say("done")
    text = getattr(history[-1], "text", "0")
    return ModelResponse(tool_calls=[call("hold", run=int(text))])


recovery = dex.Agent(name="recovery", model=Scripted(script), tools=[hold])

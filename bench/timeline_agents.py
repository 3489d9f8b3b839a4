"""The agent of ``bench.timeline``: ``bench.agents``' model -> read -> model turn, whose
model and tool note when the Worker entered and left them (``time.time()``, the clock the
server stamps Steps with) in the file ``DEX_BENCH_TIMELINE`` names, one line each:
``model|tool in|out TIME TEXT`` where TEXT is the turn's user message."""

from __future__ import annotations

import os
import time

import dex
from dex.models import Scripted, call, say
from dex.wire import Item, ModelResponse, ToolResultItem, UserItem

_notes = open(os.environ["DEX_BENCH_TIMELINE"], "a", buffering=1)  # noqa: SIM115 - the process's


def _note(what: str, text: str) -> None:
    _notes.write(f"{what} {time.time():.6f} {text}\n")


def respond(history: list[Item]) -> ModelResponse:
    text = next(i.text for i in reversed(history) if isinstance(i, UserItem))
    _note("model in", text)
    if history and isinstance(history[-1], ToolResultItem):
        response = say("done")
    else:
        response = ModelResponse(tool_calls=[call("read", "c1", key=text)], stop_reason="tool_use")
    _note("model out", text)
    return response


@dex.tool(kind="read")
async def read(key: str) -> str:
    """Return the key, noting when it ran."""
    _note("tool in", key)
    _note("tool out", key)
    return key


bench = dex.Agent(name="bench", model=Scripted(respond), instructions="Benchmark.", tools=[read])

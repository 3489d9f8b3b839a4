"""The agent of ``bench.takeover``: every turn is model -> one ``write`` tool -> model.

``write`` is a single-attempt tool (kind ``write``): Dex runs each call at most once, so
a call that a failover interrupts records ``outcome_unknown`` and never runs again. Each
run of its body first appends one line to a ledger outside Dex (``DEX_TAKEOVER_LEDGER``, a
``dex.testing.Ledger``) with the call's idempotency key, then works for ``WORK`` seconds:
``bench.takeover`` fails the leader once a new line appears, so the fault lands while a
write runs, and holds the ledger against what Dex recorded (``ledger_problems``).
"""

from __future__ import annotations

import asyncio
import os

import dex
from dex.models import Scripted, call, say
from dex.testing import Ledger
from dex.wire import Item, ModelResponse, ToolResultItem, UserItem

LEDGER = Ledger(os.environ.get("DEX_TAKEOVER_LEDGER", "takeover-ledger.jsonl"))
WORK = 0.05
"""Seconds a write's body works after its ledger line: the window a fault aims at."""


def respond(history: list[Item]) -> ModelResponse:
    """Ask for ``write`` of the user's message; answer once its result is there."""
    if history and isinstance(history[-1], ToolResultItem):
        return say("done")
    text = next(i.text for i in reversed(history) if isinstance(i, UserItem))
    return ModelResponse(tool_calls=[call("write", "c1", note=text)], stop_reason="tool_use")


@dex.tool(kind="write")
async def write(note: str, ctx: dex.ToolContext) -> str:
    """Append the note to the ledger: a write that must never run twice."""
    LEDGER.record(
        "write",
        key=ctx.idempotency_key,
        session=ctx.session_id,
        call=ctx.call_id,
        attempt=ctx.attempt,
        note=note,
        pid=os.getpid(),
    )
    await asyncio.sleep(WORK)
    return f"wrote {note}"


takeover = dex.Agent(
    name="takeover", model=Scripted(respond), instructions="Failover.", tools=[write]
)

"""The agent ``bench.soak`` runs in its Worker processes.

The scripted model reads the last user message, ``"<message id> call: [[tool, {args}], ...]"``,
asks for those tool calls in one response, and once every call has a result answers
``"results: ..."``. Every tool takes a ``tag`` (unique per call, chosen by the soak's
client, so a call can be found without trusting Dex) and ``ms`` (how long its body takes,
so kills land while tools run).

Tools keep a ledger outside Dex (``DEX_SOAK_LEDGER``, one JSON line per effect, written
before and after the body's work): the invariant checker compares it with what Dex
recorded.

- ``lookup`` (read): ``lookup``, then waits ``ms``.
- ``upsert`` (idempotent_write): ``upsert``, waits ``ms``, ``upsert.done``.
- ``charge`` (write): ``charge``, waits ``ms``, ``charge.done``.
- ``transfer`` (write, needs approval): ``transfer``, waits ``ms``, ``transfer.done``.
- ``render`` (task): the start writes ``render.start``; each poll ``render.poll``; the task
  is done ``ms`` after its start.
- ``nap`` (read with a durable timer): ``nap`` (with ``sleeps_done``), ``ctx.sleep(ms)``,
  then ``nap.fired``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import dex
from dex.models import Scripted, say
from dex.testing import Ledger
from dex.wire import AssistantItem, Item, ModelResponse, ModelToolCall, ToolResultItem, UserItem

LEDGER = Ledger(os.environ.get("DEX_SOAK_LEDGER", "soak-ledger.jsonl"))
RETRY = dex.RetryPolicy(max_attempts=5, initial_backoff_seconds=0.05, max_backoff_seconds=1.0)


def script(history: list[Item]) -> ModelResponse:
    last_user = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last_user]
    assert isinstance(user, UserItem)
    after = history[last_user + 1 :]
    _, sep, calls_json = user.text.partition(" call: ")
    if not sep:
        return say(f"echo: {user.text}")
    if any(isinstance(item, AssistantItem) for item in after):
        results = [
            {"name": r.name, "status": r.status.value}
            for r in after
            if isinstance(r, ToolResultItem)
        ]
        return say("results: " + json.dumps(results, sort_keys=True))
    calls = json.loads(calls_json)
    return ModelResponse(
        tool_calls=[
            ModelToolCall(id=f"c{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(calls)
        ],
        stop_reason="tool_use",
    )


def record(effect: str, tag: str, ctx: dex.ToolContext, **fields: Any) -> None:
    LEDGER.record(
        effect,
        tag=tag,
        key=ctx.idempotency_key,
        session=ctx.session_id,
        call=ctx.call_id,
        attempt=ctx.attempt,
        pid=os.getpid(),
        at=time.time(),
        **fields,
    )


@dex.tool(kind="read", retry=RETRY)
async def lookup(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Read a value."""
    record("lookup", tag, ctx)
    await asyncio.sleep(ms / 1000)
    return f"value of {tag}"


@dex.tool(kind="idempotent_write", retry=RETRY)
async def upsert(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Write a record keyed by the idempotency key."""
    record("upsert", tag, ctx)
    await asyncio.sleep(ms / 1000)
    record("upsert.done", tag, ctx)
    return f"stored {tag}"


@dex.tool(kind="write")
async def charge(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Charge a card: not idempotent, so Dex runs it at most once."""
    record("charge", tag, ctx)
    await asyncio.sleep(ms / 1000)
    record("charge.done", tag, ctx)
    return f"charged {tag}"


@dex.tool(kind="write", approval=True)
async def transfer(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Move money: needs approval, runs at most once."""
    record("transfer", tag, ctx)
    await asyncio.sleep(ms / 1000)
    record("transfer.done", tag, ctx)
    return f"transferred {tag}"


@dex.tool(kind="task", retry=RETRY, poll_interval=0.1)
async def render(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Start a render job; the handle is ``<idempotency key>|<when it is done>``."""
    record("render.start", tag, ctx)
    return f"{ctx.idempotency_key}|{time.time() + ms / 1000}"


@render.poll
async def render_poll(ctx: dex.ToolContext, handle: str) -> object:
    key, _, due = handle.rpartition("|")
    record("render.poll", "", ctx, handle_key=key)
    return f"rendered {key}" if time.time() >= float(due) else dex.PENDING


@dex.tool(kind="read", retry=RETRY)
async def nap(tag: str, ms: int, ctx: dex.ToolContext) -> str:
    """Sleep durably (a timer in the server), then wake."""
    record("nap", tag, ctx, sleeps_done=ctx.sleeps_done)
    await ctx.sleep(ms / 1000)
    record("nap.fired", tag, ctx, sleeps_done=ctx.sleeps_done)
    return "woke"


soak = dex.Agent(
    name="soak",
    model=Scripted(script),
    instructions="You are the soak's agent.",
    tools=[lookup, upsert, charge, transfer, render, nap],
    model_retry=RETRY,
)

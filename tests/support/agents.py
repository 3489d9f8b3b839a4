"""Agents that the end-to-end and crash tests run in real Worker processes.

The scripted model reads the last user message:
    "call: [[tool, {args}], ...]"  asks for those tool calls (all in one response),
    anything else                  answers "echo: <text>".
Once every call has a result, it answers "results: <json of statuses and results>".

Tools keep a ledger outside Dex (``DEX_TEST_LEDGER``). A tool whose ``gate`` argument
is set records its effect, writes ``<gate>.<attempt>.entered``,
then waits for ``<gate>.open`` (``DEX_TEST_GATES``),
so a test can kill a Worker while the tool runs.

The scripted model keeps the same ledger: every model call records ``model`` and every
summary call ``summary`` (each with ``session_id`` and ``attempt``) as it starts, so a
test counts the calls the model really received, late ones included.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dex
from dex.models import Scripted as _Scripted
from dex.models import say
from dex.models.base import ModelRequest, RateLimited
from dex.testing import Gates, Ledger
from dex.wire import (
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    Summary,
    ToolResultItem,
    Usage,
    UserItem,
)

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))
GATES = Path(os.environ.get("DEX_TEST_GATES", "."))
GATE = Gates(GATES)


COUNT_CALLS = "DEX_TEST_LEDGER" in os.environ
"""The model records its calls only in a ledger a test named: a Worker some end-to-end
test starts without one (its model calls, no tools) leaves no ledger.jsonl behind."""


def record_call(effect: str, request: ModelRequest) -> None:
    if COUNT_CALLS:
        LEDGER.record(effect, session_id=request.session_id, attempt=request.attempt)


class Scripted(_Scripted):
    """``dex.models.Scripted`` that records each call in the ledger as it starts: ``model``
    for a model call, ``summary`` for a summary call (``session_id``, ``attempt``)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        record_call("model", request)
        async for event in super().stream(request):
            yield event

    async def summarize(self, request: ModelRequest) -> Summary:
        record_call("summary", request)
        return await super().summarize(request)


def script(history: list[Item]) -> ModelResponse:
    last_user = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last_user]
    assert isinstance(user, UserItem)
    after = history[last_user + 1 :]
    if not user.text.startswith("call:"):
        return say(f"echo: {user.text}")
    results = [item for item in after if isinstance(item, ToolResultItem)]
    if any(isinstance(item, AssistantItem) for item in after):
        summary = [
            {"name": r.name, "status": r.status.value, "result": r.result, "error": r.error}
            for r in results
        ]
        return say("results: " + json.dumps(summary, sort_keys=True))
    calls = json.loads(user.text.removeprefix("call:"))
    return ModelResponse(
        tool_calls=[
            ModelToolCall(id=f"c{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(calls)
        ],
        stop_reason="tool_use",
    )


@dex.tool(kind="read", retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05))
async def lookup(key: str, ctx: dex.ToolContext, gate: str | None = None) -> dict[str, Any]:
    """Read a value."""
    LEDGER.record("lookup", key=key, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return {"key": key, "value": key.upper()}


@dex.tool(kind="write")
async def charge(amount: int, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Charge a card: not idempotent, so Dex runs it at most once."""
    LEDGER.record("charge", amount=amount, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"charged {amount}"


@dex.tool(
    kind="idempotent_write", retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05)
)
async def upsert(key: str, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Write a record keyed by the idempotency key."""
    LEDGER.record("upsert", key=key, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"stored {key}"


@dex.tool(kind="read")
async def refuse(reason: str) -> str:
    """Fails with a known outcome."""
    raise dex.ToolError(reason)


@dex.tool(kind="read", retry=dex.RetryPolicy(max_attempts=2, initial_backoff_seconds=0.05))
async def flaky(ctx: dex.ToolContext) -> str:
    """Raises on every attempt: a failed attempt, not a known outcome."""
    LEDGER.record("flaky", idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")


@dex.tool(kind="write")
def slow_charge(
    amount: int, ctx: dex.ToolContext, seconds: float = 0, gate: str | None = None
) -> str:
    """A plain-function write that blocks its thread: ``time.sleep(seconds)``, then (with a
    ``gate``) a blocking wait for the gate. It runs in a thread, so the Worker's heartbeats
    and other Steps go on meanwhile."""
    LEDGER.record("slow_charge", amount=amount, idempotency_key=ctx.idempotency_key)
    time.sleep(seconds)
    if gate:
        (GATES / f"{gate}.{ctx.attempt}.entered").write_text("")
        while not (GATES / f"{gate}.open").exists():
            time.sleep(0.005)
    LEDGER.record("slow_charge.done", amount=amount, idempotency_key=ctx.idempotency_key)
    return f"charged {amount} slowly"


@dex.tool(kind="idempotent_write", retry=dex.RetryPolicy(initial_backoff_seconds=0.05))
def slow_order(item: str, ctx: dex.ToolContext) -> str:
    """A plain-function tool that asks a question (``ctx.ask_sync``) from its thread."""
    LEDGER.record("slow_order.before_ask", answers=len(ctx.answers))
    size = ctx.ask_sync(f"Which size of {item}?", choices=["S", "M", "L"])
    LEDGER.record("slow_order", item=item, size=size, idempotency_key=ctx.idempotency_key)
    return f"ordered {item} in {size}"


_FAST = dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05)

assistant = dex.Agent(
    name="assistant",
    model=Scripted(script),
    instructions="You are a test agent.",
    tools=[lookup, charge, upsert, refuse, flaky, slow_charge, slow_order],
    model_retry=_FAST,
)


def flood_script(history: list[Item]) -> ModelResponse:
    """Answers with as many characters as the user's message says."""
    user = history[-1]
    assert isinstance(user, UserItem)
    return say("y" * int(user.text))


flood = dex.Agent(
    name="flood",
    model=Scripted(flood_script, chunk_chars=500, delay_per_chunk=0.0001),  # MB/s of deltas
    model_retry=_FAST,
)

streamer = dex.Agent(
    name="streamer",
    model=Scripted(script, chunk_chars=4, delay_per_chunk=0.01),
    tools=[lookup],
    model_retry=_FAST,
)

failing = dex.Agent(
    name="failing",
    model=Scripted(script, fail_attempts=99),
    tools=[lookup],
    model_retry=_FAST,
)


def fragile_script(history: list[Item]) -> ModelResponse:
    """Asks for the tools, then fails on every attempt once their results are in."""
    last_user = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    if any(isinstance(item, ToolResultItem) for item in history[last_user:]):
        raise RuntimeError("the model provider is down")
    notes = [item.text for item in history if isinstance(item, NoteItem)]
    if notes:
        return say("I see a note: " + notes[-1])
    return script(history)


fragile = dex.Agent(
    name="fragile",
    model=Scripted(fragile_script),
    tools=[lookup, charge],
    model_retry=_FAST,
)


# --- waits and long work (issue: approvals, questions, timers, tasks, checks) ------------


@dex.tool(kind="write", approval=True)
async def delete_all(ctx: dex.ToolContext) -> str:
    """Always needs approval."""
    LEDGER.record("delete_all", idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    return "deleted"


@dex.tool(kind="write", approval=lambda amount, gate=None: amount > 100)
async def transfer(amount: int, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Needs approval above 100."""
    LEDGER.record("transfer", amount=amount, idempotency_key=ctx.idempotency_key)
    await GATE.wait(gate, ctx.attempt)
    return f"transferred {amount}"


@dex.tool(kind="idempotent_write", retry=_FAST)
async def order(item: str, ctx: dex.ToolContext) -> str:
    """Asks which size, then orders."""
    LEDGER.record("order.before_ask", attempt=ctx.attempt, answers=len(ctx.answers))
    size = await ctx.ask(f"Which size of {item}?", choices=["S", "M", "L"])
    LEDGER.record("order", item=item, size=size, idempotency_key=ctx.idempotency_key)
    return f"ordered {item} in {size}"


@dex.tool(kind="read", retry=_FAST)
async def remind(seconds: float, ctx: dex.ToolContext) -> str:
    """Sleeps durably, then reminds."""
    LEDGER.record("remind.before_sleep", sleeps_done=ctx.sleeps_done)
    await ctx.sleep(seconds)
    LEDGER.record("remind", idempotency_key=ctx.idempotency_key)
    return "time is up"


@dex.tool(kind="task", retry=_FAST, poll_interval=0.05)
async def render(scene: str, ctx: dex.ToolContext) -> str:
    """Starts a render job; the handle is the idempotency key."""
    LEDGER.record(
        "render.start", scene=scene, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt
    )
    return ctx.idempotency_key


@render.poll
async def render_poll(ctx: dex.ToolContext, handle: str) -> object:
    LEDGER.record("render.poll", handle=handle, attempt=ctx.attempt)
    gate = handle.replace("/", "_")
    if (GATES / f"{gate}.pause").exists():
        (GATES / f"{gate}.polling").write_text("")
        while not (GATES / f"{gate}.open").exists():
            await asyncio.sleep(0.005)
    if (GATES / f"{gate}.done").exists():
        return f"rendered {handle}"
    return dex.PENDING


@dex.tool(kind="write")
async def pay(amount: int, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """A write with a check probe: the bank can be asked whether the payment happened."""
    LEDGER.record("pay", amount=amount, idempotency_key=ctx.idempotency_key)
    await GATE.wait(gate, ctx.attempt)
    return f"paid {amount}"


@pay.check
async def pay_check(ctx: dex.ToolContext, amount: int, gate: str | None = None) -> dex.Checked:
    found = [e for e in LEDGER.entries("pay") if e["idempotency_key"] == ctx.idempotency_key]
    LEDGER.record("pay.check", found=len(found))
    return dex.Checked(happened=bool(found), result=f"paid {amount} (found by check)")


@dex.tool(kind="idempotent_write", retry=_FAST, approval=True)
async def publish(post: str, ctx: dex.ToolContext) -> str:
    """Needs approval; a keyed write, so it may run again after a crash."""
    LEDGER.record("publish", post=post, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    return f"published {post}"


@dex.tool(kind="task", retry=_FAST, poll_interval=1.0)
async def export(report: str, ctx: dex.ToolContext) -> str:
    """Starts an export job polled once a second (a wide gap between two polls); the handle
    is the idempotency key."""
    LEDGER.record(
        "export.start", report=report, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt
    )
    return ctx.idempotency_key


@export.poll
async def export_poll(ctx: dex.ToolContext, handle: str) -> object:
    """Done once ``<handle with / replaced by _>.done`` exists."""
    LEDGER.record("export.poll", handle=handle, attempt=ctx.attempt)
    if (GATES / f"{handle.replace('/', '_')}.done").exists():
        return f"exported {handle}"
    return dex.PENDING


waiter = dex.Agent(
    name="waiter",
    model=Scripted(script),
    tools=[
        delete_all,
        transfer,
        order,
        remind,
        render,
        pay,
        lookup,
        charge,
        publish,
        export,
        dex.timer_tool(),
    ],
    model_retry=_FAST,
)

compactor = dex.Agent(
    name="compactor",
    model=Scripted(script),
    tools=[lookup],
    model_retry=_FAST,
    compact_threshold_chars=400,
)

broken_summaries = dex.Agent(
    name="broken_summaries",
    model=Scripted(script, fail_summaries=True),
    tools=[lookup],
    model_retry=_FAST,
    compact_threshold_chars=400,
)


class GatedSummaries(Scripted):
    """A scripted model whose summary call, once recorded in the ledger, waits behind the
    gate ``summary`` (``summary.<attempt>.entered``, ``summary.open``), so a test can
    interrupt a CompactContext while its summary call runs."""

    async def summarize(self, request: ModelRequest) -> Summary:
        record_call("summary", request)
        await GATE.wait("summary", request.attempt)
        return await _Scripted.summarize(self, request)


slow_summaries = dex.Agent(
    name="slow_summaries",
    model=GatedSummaries(script),
    tools=[lookup],
    model_retry=_FAST,
    compact_threshold_chars=400,
)


LIMITED_GROUP = "limited-group"
"""The model group of ``limited``'s model, which the limits tests limit."""


class Limited(Scripted):
    """``Scripted`` whose calls a test can hold or refuse, by the last user message:
    ``hold:GATE`` waits at ``GATE`` (``GATE.<attempt>.entered``, ``GATE.open``) before it
    answers; ``ratelimit:GATE`` refuses the call for the provider's rate limit
    (``RateLimited``, Retry-After 3 s, ledger ``refused``) until ``GATE.open`` exists.
    Each call it serves it records as ``served``, with the time (``at``)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        user = next(i for i in reversed(request.history) if isinstance(i, UserItem))
        verb, _, gate = user.text.partition(":")
        at = time.time()
        if verb == "ratelimit" and not (GATES / f"{gate}.open").exists():
            LEDGER.record("refused", session_id=request.session_id, attempt=request.attempt, at=at)
            raise RateLimited("429: slow down", retry_after=RETRY_AFTER)
        LEDGER.record("served", session_id=request.session_id, attempt=request.attempt, at=at)
        if verb == "hold":
            await GATE.wait(gate, request.attempt)
        async for event in super().stream(request):
            yield event


RETRY_AFTER = 3.0
"""The Retry-After of ``Limited``'s refusals, in seconds."""


@dex.tool(kind="idempotent_write", concurrency_key="{customer}")
async def book(customer: str, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Book a table for a customer: one booking at a time per customer."""
    LEDGER.record("book", customer=customer, key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"booked for {customer}"


limited = dex.Agent(
    name="limited",
    model=Limited(script, group=LIMITED_GROUP),
    tools=[book],
    model_retry=_FAST,
)


SPENT = Usage(input_tokens=1_000, output_tokens=100)
"""What each model call of ``spender`` reports using: at claude-sonnet-4-5's price (the
model it names), $0.0045."""


def spend(history: list[Item]) -> ModelResponse:
    """``script``'s answer, having used ``SPENT``."""
    response = script(history)
    response.usage = SPENT.model_copy()
    return response


spender = dex.Agent(
    name="spender",
    model=Scripted(spend, name="claude-sonnet-4-5"),
    tools=[lookup, charge],
    model_retry=_FAST,
)
"""The budget tests' agent: every model call uses 1,100 tokens (``SPENT``), so a session
with a budget reaches it after a known number of calls."""

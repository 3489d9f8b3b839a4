"""The demo's agent: a concierge with a read, a non-idempotent write and an idempotent write.

The tools act on a tiny "outside world": a JSON-lines ledger in ``DEX_DEMO_DIR`` that
stands for the restaurant's and the billing system's own records, which is how the
demo shows what really happened, not just what Dex says.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import dex
from dex.models import Scripted, call, say
from dex.testing import Ledger
from dex.wire import AssistantItem, Item, ModelResponse, ToolResultItem, UserItem

WORLD = Path(os.environ.get("DEX_DEMO_DIR", "."))
LEDGER = Ledger(WORLD / "world.jsonl")


async def _slow_external_call(name: str) -> None:
    """The outside system takes its time; the demo kills the Worker meanwhile."""
    (WORLD / f"{name}.running").write_text("")
    while not (WORLD / f"{name}.done").exists():
        await asyncio.sleep(0.01)


@dex.tool(kind="read")
async def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny and 21°C in {city}"


@dex.tool(kind="write")
async def book_table(restaurant: str, people: int, time: str, ctx: dex.ToolContext) -> str:
    """Book a restaurant table. Not idempotent: a second call books a second table."""
    LEDGER.record(
        "table booked", restaurant=restaurant, people=people, time=time, attempt=ctx.attempt
    )
    await _slow_external_call("book_table")
    return f"table for {people} at {restaurant}, {time}"


@dex.tool(
    kind="idempotent_write", retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.2)
)
async def send_invoice(customer: str, amount: int, ctx: dex.ToolContext) -> str:
    """Send an invoice. The billing system de-duplicates by idempotency key."""
    sent = {e["key"] for e in LEDGER.entries("invoice sent")}
    if ctx.idempotency_key not in sent:
        LEDGER.record(
            "invoice sent",
            customer=customer,
            amount=amount,
            key=ctx.idempotency_key,
            attempt=ctx.attempt,
        )
    else:
        LEDGER.record("duplicate invoice ignored", key=ctx.idempotency_key, attempt=ctx.attempt)
    await _slow_external_call(f"send_invoice.{ctx.attempt}")
    return f"invoice of {amount} EUR sent to {customer}"


def concierge(history: list[Item]) -> ModelResponse:
    """A scripted stand-in for a model: answers depend only on the history."""
    last = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last]
    assert isinstance(user, UserItem)
    asked = any(isinstance(i, AssistantItem) and i.tool_calls for i in history[last + 1 :])
    results = [i for i in history[last + 1 :] if isinstance(i, ToolResultItem)]
    text = user.text.lower()
    if asked:
        (result,) = results
        if result.status == "succeeded":
            return say(f"Done: {result.result}.")
        if result.status == "outcome_unknown":
            return say(
                f"I could not confirm whether {result.name} went through, so I will not try "
                "again on my own. Please check with the restaurant before I book anything else."
            )
        return say(f"That failed: {result.error}")
    if "weather" in text:
        return ModelResponse(tool_calls=[call("get_weather", city="Paris")])
    if "book" in text:
        return ModelResponse(
            tool_calls=[call("book_table", restaurant="Chez Dex", people=2, time="20:00")]
        )
    if "invoice" in text:
        return ModelResponse(tool_calls=[call("send_invoice", customer="ACME", amount=120)])
    return say("I can check the weather, book a table, or send an invoice.")


def choose_model() -> tuple[dex.models.Model, str]:
    """A real model when an API key is in the environment, else the scripted stand-in."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        name = os.environ.get("DEX_DEMO_MODEL", "claude-sonnet-4-5")
        return dex.models.Anthropic(model=name), f"Anthropic {name} (ANTHROPIC_API_KEY is set)"
    if os.environ.get("OPENAI_API_KEY"):
        name = os.environ.get("DEX_DEMO_MODEL", "gpt-4.1-mini")
        return dex.models.OpenAI(model=name), f"OpenAI {name} (OPENAI_API_KEY is set)"
    scripted = Scripted(concierge, chunk_chars=8, delay_per_chunk=0.01)
    return scripted, "the scripted model (no ANTHROPIC_API_KEY or OPENAI_API_KEY is set)"


agent = dex.Agent(
    name="concierge",
    model=choose_model()[0],
    instructions=(
        "You are a concierge. Use get_weather for weather, book_table to book (Chez Dex, "
        "for the number of people and time the user gives), send_invoice to invoice (ACME, "
        "120). Call each tool at most once per request. Never repeat a call whose outcome "
        "is unknown: tell the user to check first."
    ),
    tools=[get_weather, book_table, send_invoice],
)

"""The agent the console's conversation tests talk to, in a real Worker process: a
scripted model that streams its text (4 characters every 10 ms) and tools that wait for
a person, each recording what it did in the ledger (``DEX_TEST_LEDGER``).

The model reads the last user message:
    "delete everything"   says so, and asks for ``delete_all`` (it needs an approval)
    "quietly delete"      asks for ``delete_all`` and says nothing
    "order a shirt"       asks for ``order``, which asks which size
    anything else         answers "echo: <text>"
Once its tools have results, it answers "done: <each tool's result>".
"""

from __future__ import annotations

import os

import dex
from dex.models import Scripted, say
from dex.testing import Ledger
from dex.wire import AssistantItem, Item, ModelResponse, ModelToolCall, ToolResultItem, UserItem

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))


@dex.tool(kind="write", approval=True)
async def delete_all(ctx: dex.ToolContext) -> str:
    """Always needs approval."""
    LEDGER.record("delete_all", idempotency_key=ctx.idempotency_key)
    return "deleted"


@dex.tool(kind="idempotent_write")
async def order(item: str, ctx: dex.ToolContext) -> str:
    """Asks which size, then orders."""
    size = await ctx.ask(f"Which size of {item}?", choices=["S", "M", "L"])
    LEDGER.record("order", item=item, size=size, idempotency_key=ctx.idempotency_key)
    return f"ordered {item} in {size}"


ASKS = {
    "delete everything": ("I will delete everything: that needs your approval.", "delete_all", {}),
    "quietly delete": ("", "delete_all", {}),
    "order a shirt": ("", "order", {"item": "shirt"}),
}


def script(history: list[Item]) -> ModelResponse:
    last = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last]
    assert isinstance(user, UserItem)
    after = history[last + 1 :]
    if user.text not in ASKS:
        return say(f"echo: {user.text}")
    if any(isinstance(item, AssistantItem) for item in after):
        results = [str(i.result or i.error) for i in after if isinstance(i, ToolResultItem)]
        return say("done: " + "; ".join(results))
    text, tool, arguments = ASKS[user.text]
    call = ModelToolCall(id="c0", name=tool, arguments=arguments)
    return ModelResponse(text=text, tool_calls=[call], stop_reason="tool_use")


chat = dex.Agent(
    name="chat",
    model=Scripted(script, chunk_chars=4, delay_per_chunk=0.01),
    tools=[delete_all, order],
)

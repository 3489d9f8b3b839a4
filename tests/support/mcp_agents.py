"""An agent whose tools come from the test MCP server (``mcp_server.py``), for the crash
tests that run it in real Worker processes (``rig.start_worker(module=...)``).

``DEX_TEST_MCP_URL`` is the server's Streamable HTTP address. The scripted model speaks
as ``agents.py``'s: "call: [[tool, {args}], ...]" asks for those calls, then it answers
"results: <json of statuses and results>". It records each call in the ledger
(``DEX_TEST_LEDGER``) as it starts: ``model``, with the session, the attempt and the
names of the tools it was offered.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import dex
from dex.models import Scripted, say
from dex.models.base import ModelRequest
from dex.testing import Ledger
from dex.wire import AssistantItem, Item, ModelResponse, ModelToolCall, ToolResultItem, UserItem

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))


def script(history: list[Item]) -> ModelResponse:
    last_user = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    user = history[last_user]
    assert isinstance(user, UserItem)
    after = history[last_user + 1 :]
    if not user.text.startswith("call:"):
        return say(f"echo: {user.text}")
    if any(isinstance(item, AssistantItem) for item in after):
        summary = [
            {"name": r.name, "status": r.status.value, "result": r.result, "error": r.error}
            for r in after
            if isinstance(r, ToolResultItem)
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


class Listing(Scripted):
    """Records each model call, with the tools it was offered, as it starts."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        LEDGER.record(
            "model",
            session_id=request.session_id,
            attempt=request.attempt,
            tools=sorted(t.name for t in request.tools),
        )
        async for event in super().stream(request):
            yield event


assistant = dex.Agent(
    name="mcp_assistant",
    model=Listing(script),
    tools=[
        dex.mcp_tools(
            url=os.environ["DEX_TEST_MCP_URL"],
            retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05),
        )
    ],
)

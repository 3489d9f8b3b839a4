"""A Claude Agent SDK agent on Dex, for crash tests in real Worker processes.

Its CLI talks only to a fake Anthropic server (``DEX_TEST_PROVIDER_URL``,
``DEX_TEST_PROVIDER_KEY``) whose script the test holds, works in ``DEX_TEST_CWD``, and
may run Bash. ``charge`` (write) and ``upsert`` (idempotent write) are Dex tools, with
the ledger (``DEX_TEST_LEDGER``) and gates (``DEX_TEST_GATES``) of the other test agents:
with a ``gate`` a tool writes ``<gate>.<attempt>.entered`` and waits for ``<gate>.open``.
"""

from __future__ import annotations

import os
from pathlib import Path

from claude_agent_sdk import ClaudeAgentOptions

import dex
from dex.adapters.claude_agent_sdk import ClaudeAgent
from dex.testing import Gates, Ledger

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))
GATES = Path(os.environ.get("DEX_TEST_GATES", "."))
GATE = Gates(GATES)
_FAST = dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05)


@dex.tool(kind="write")
async def charge(amount: int, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Charge a card: not idempotent, so Dex runs it at most once."""
    LEDGER.record("charge", amount=amount, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"charged {amount}"


@dex.tool(kind="idempotent_write", retry=_FAST)
async def upsert(key: str, ctx: dex.ToolContext, gate: str | None = None) -> str:
    """Write a record keyed by the idempotency key."""
    LEDGER.record("upsert", key=key, idempotency_key=ctx.idempotency_key, attempt=ctx.attempt)
    await GATE.wait(gate, ctx.attempt)
    return f"stored {key}"


coder = dex.Agent(
    name="coder",
    model=ClaudeAgent(
        ClaudeAgentOptions(
            model="claude-sonnet-4-5",
            cwd=os.environ.get("DEX_TEST_CWD", "."),
            allowed_tools=["Bash"],
            max_turns=8,
            env={
                "ANTHROPIC_BASE_URL": os.environ.get("DEX_TEST_PROVIDER_URL", "http://127.0.0.1:9"),
                "ANTHROPIC_API_KEY": os.environ.get("DEX_TEST_PROVIDER_KEY", "test-key"),
            },
        )
    ),
    tools=[charge, upsert],
    model_retry=_FAST,
)

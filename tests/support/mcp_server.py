"""An MCP server for the tests, with its own ledger of side effects (``DEX_TEST_LEDGER``).

    python tests/support/mcp_server.py stdio
    python tests/support/mcp_server.py http PORT

Every tool records its effect as it starts (with the ``_meta`` Dex sent: idempotency
key, call id, attempt), then, with a ``gate``, writes ``<gate>.<attempt>.entered`` and
waits for ``<gate>.open`` in ``DEX_TEST_GATES`` (``dex.testing.Gates``), so a test can kill
a Worker while the tool runs. Kinds come from the annotations: ``find`` is read-only,
``put`` idempotent, ``send`` neither (a write). ``oops`` answers an error result.

When the file ``DEX_TEST_MCP_EXTRA`` names exists as the tools are listed, the server
lists one tool more (``extra``): a server whose tool list changed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from dex.testing import Gates, Ledger

LEDGER = Ledger(os.environ.get("DEX_TEST_LEDGER", "ledger.jsonl"))
GATES = Gates(os.environ.get("DEX_TEST_GATES", "."))
EXTRA = os.environ.get("DEX_TEST_MCP_EXTRA")

app = MCPServer("dex-test-tools")


def _record(effect: str, ctx: Context, **fields: Any) -> int:
    """Record ``effect`` with what Dex sent in ``_meta``; the call's attempt number."""
    meta: dict[str, Any] = dict(ctx.request_context.meta or {})
    attempt = int(meta.get("dex/attempt", 0))
    LEDGER.record(
        effect,
        idempotency_key=meta.get("dex/idempotency_key"),
        call_id=meta.get("dex/call_id"),
        attempt=attempt,
        pid=os.getpid(),
        **fields,
    )
    return attempt


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
async def find(key: str, ctx: Context, gate: str = "") -> str:
    """Read a value."""
    await GATES.wait(gate, _record("find", ctx, key=key))
    return f"{key} is {key.upper()}"


@app.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
async def put(key: str, ctx: Context, gate: str = "") -> str:
    """Store a value under a key (again is harmless)."""
    await GATES.wait(gate, _record("put", ctx, key=key))
    return f"stored {key}"


@app.tool()
async def send(to: str, ctx: Context, gate: str = "") -> str:
    """Send a message: not idempotent."""
    await GATES.wait(gate, _record("send", ctx, to=to))
    return f"sent to {to}"


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
async def oops(reason: str) -> str:
    """Fails with a known outcome."""
    raise ToolError(reason)


if EXTRA is not None and Path(EXTRA).exists():

    @app.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def extra() -> str:
        """A tool the server lists only sometimes."""
        return "extra"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()

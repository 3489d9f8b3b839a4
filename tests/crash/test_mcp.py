"""MCP tools (``dex.mcp_tools``) under crashes: the test MCP server runs as a process of its
own and keeps its own ledger, with the ``_meta`` each call carried. A call the server is
running when the Worker (or the node) dies follows the row of its kind: a tool without
hints is a write, never sent twice; an ``idempotentHint`` tool is sent again with the same
idempotency key. The tools offered the model are the same before and after the crash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash.helpers import columns, interrupt
from tests.support.mcp_process import MCPServerProcess
from tests.support.rig import Rig, attempts, results

MCP_AGENTS = str(Path(__file__).parents[1] / "support" / "mcp_agents.py")
TOOLS = ["find", "oops", "put", "send"]


@pytest.fixture
def mcp(rig: Rig) -> Iterator[MCPServerProcess]:
    """The MCP server, and the rig's Workers (the new one a crash starts too) serving the
    agent whose tools it lists."""
    server = MCPServerProcess(
        {"DEX_TEST_LEDGER": str(rig.ledger.path), "DEX_TEST_GATES": str(rig.gates)},
        rig.tmp / "mcp.log",
    ).start()
    rig.worker_module = MCP_AGENTS
    rig.worker_env["DEX_TEST_MCP_URL"] = server.url
    try:
        yield server
    finally:
        server.kill()


def offered(rig: Rig, session_id: str) -> list[list[str]]:
    """The tools each of the session's model calls offered, by the model's own ledger."""
    return [e["tools"] for e in rig.ledger.entries("model") if e["session_id"] == session_id]


@columns("mcp_write.running", takeover=True)
def test_mcp_write_interrupted_while_running_is_unknown_and_never_sent_again(
    rig: Rig, mcp: MCPServerProcess, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("mcp_assistant")
    turn = rig.call(sid, ("send", {"to": "ann", "gate": "g"}))
    rig.wait_entered("g", 1)

    interrupt(rig, column, worker)
    t = rig.wait_turn(sid, turn)
    rig.open_gate("g")  # the server's call that was cut off ends: nothing more is sent

    (call,) = t["tool_calls"]
    assert call["status"] == "outcome_unknown"
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "failed")]]
    assert t["steps"][1]["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert results(t)[0]["status"] == "outcome_unknown"  # what the model saw
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "anything else?")["turn"])
    assert follow["text"] == "echo: anything else?"
    sent = rig.ledger.entries("send")  # the MCP server's own record: one call, ever
    assert [(e["attempt"], e["idempotency_key"]) for e in sent] == [(1, call["idempotency_key"])]
    # every model call, before the crash and after it (a new Worker), offered the same tools
    assert offered(rig, sid) == [TOOLS] * 3


@columns("mcp_idempotent.running", takeover=True)
def test_mcp_idempotent_tool_interrupted_while_running_is_sent_again_with_the_same_key(
    rig: Rig, mcp: MCPServerProcess, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("mcp_assistant")
    turn = rig.call(sid, ("put", {"key": "order-7", "gate": "g"}))
    rig.wait_entered("g", 1)

    interrupt(rig, column, worker)
    rig.wait_entered("g", 2)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]
    puts = rig.ledger.entries("put")  # the MCP server's own record, with the _meta it got
    assert [(e["attempt"], e["idempotency_key"], e["call_id"]) for e in puts] == [
        (1, call["idempotency_key"], call["id"]),
        (2, call["idempotency_key"], call["id"]),
    ]
    assert results(t) == [
        {"name": "put", "status": "succeeded", "result": "stored order-7", "error": None}
    ]
    # the turn's first model call ran on the killed Worker, its second on the new one
    assert offered(rig, sid) == [TOOLS, TOOLS]

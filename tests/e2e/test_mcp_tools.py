"""MCP tools through a real server and Worker: an ``isError`` result and a refused call are
failed tool calls the model sees (the turn goes on), a good call succeeds, and the agent
registers the kinds the annotations give."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mcp_process import MCPServerProcess
from tests.support.rig import Rig, attempts, results

MCP_AGENTS = str(Path(__file__).parents[1] / "support" / "mcp_agents.py")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    server = MCPServerProcess(
        {"DEX_TEST_LEDGER": str(r.ledger.path), "DEX_TEST_GATES": str(r.gates)},
        tmp_path / "mcp.log",
    ).start()
    r.worker_module = MCP_AGENTS
    r.worker_env["DEX_TEST_MCP_URL"] = server.url
    try:
        yield r
    finally:
        r.close()
        server.kill()


def test_an_error_result_is_a_failed_call_the_model_sees(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("mcp_assistant")
    (agent,) = rig.client.list_agents()
    assert {t["name"]: t["kind"] for t in agent["tools"]} == {
        "find": "read",
        "oops": "read",
        "put": "idempotent_write",
        "send": "write",
    }
    turn = rig.call(
        sid,
        ("oops", {"reason": "no such key"}),
        ("find", {"nokey": 1}),
        ("find", {"key": "a"}),
    )
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    oops, bad, good = results(t)
    assert oops["status"] == "failed" and "no such key" in oops["error"]
    assert bad["status"] == "failed" and "key" in bad["error"]  # the server's validation
    assert good == {"name": "find", "status": "succeeded", "result": "a is A", "error": None}
    # failed calls, not failed attempts: each ran once
    assert attempts(t, "CallTool") == [[(1, "succeeded")]] * 3
    assert [e["key"] for e in rig.ledger.entries("find")] == ["a"]

"""A client idle past the server's keep-alive (uvicorn closes an idle connection after
5 s) sends its next request on a live connection, even when its event loop was blocked
meanwhile and never saw the server close the pooled one: an approval then is recorded
once, not refused as ``no Dex Server answered``."""

from __future__ import annotations

import asyncio
import time

import dex
from tests.support.rig import Rig

SERVER_KEEP_ALIVE = 5.0
"""Seconds the server keeps an idle connection open (uvicorn's default)."""


def test_an_approval_after_the_caller_was_busy_past_the_keep_alive_is_recorded(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    with asyncio.Runner() as runner:  # the loop runs only while the caller awaits
        client = dex.Client(rig.server.address, timeout=30)
        try:
            turn = runner.run(
                client.send_message(sid, 'call: [["delete_all", {}]]', wait=True, timeout=20)
            )
            assert turn["status"] == "waiting"
            [wait] = turn["waiting_for"]
            time.sleep(SERVER_KEEP_ALIVE + 1)  # the caller busy elsewhere: the scenario
            runner.run(client.approve(sid, wait["call_id"], by="ops"))
            ended = runner.run(client.wait_turn(sid, turn["turn"], timeout=20))
        finally:
            runner.run(client.close())
    assert ended["status"] == "completed"
    assert len(rig.ledger.entries("delete_all")) == 1
    [call] = rig.client.get_agent_snapshot(sid)["tool_calls"]
    assert (call["status"], call["result"]) == ("succeeded", "deleted")
    assert call["approval"]["by"] == "ops"

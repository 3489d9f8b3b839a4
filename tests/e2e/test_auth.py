"""A server with auth on, a Worker with its worker token, clients with and without theirs."""

from __future__ import annotations

import pytest

import dex
from dex.testing import wait_until
from tests.support.rig import Rig

TOKENS = {"DEX_CLIENT_TOKEN": "c-123", "DEX_WORKER_TOKEN": "w-456", "DEX_ADMIN_TOKEN": "a-789"}


def test_tokens_let_the_right_processes_in(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.server.env.update(TOKENS)  # the server reads all three from its environment
    rig.start_server()
    impostor = rig.start_worker(env={"DEX_WORKER_TOKEN": "c-123"})  # a client token
    # refused, it exits with a message that says what to fix instead of retrying forever
    wait_until(lambda: not impostor.alive, 20, what="the refused Worker exited")
    assert impostor.proc is not None and impostor.proc.returncode == 1
    assert "refused this Worker (HTTP 403" in impostor.output()
    assert "set DEX_WORKER_TOKEN" in impostor.output()
    rig.start_worker(env={"DEX_WORKER_TOKEN": "w-456"})

    with dex.SyncClient(rig.server.address, token="c-123") as client:
        wait_until(lambda: client.list_agents(), 20, what="the real Worker registered")
        sid = client.create_session("assistant")["id"]
        assert client.send_message(sid, "hi", wait=True)["text"] == "echo: hi"

    monkeypatch.delenv("DEX_CLIENT_TOKEN", raising=False)
    with (
        dex.SyncClient(rig.server.address) as anonymous,
        pytest.raises(dex.AuthError, match="Bearer"),
    ):
        anonymous.get_agent_snapshot(sid)
    with (
        dex.SyncClient(rig.server.address, token="w-456") as wrong_role,
        pytest.raises(dex.AuthError, match="needs a client token"),
    ):
        wrong_role.get_agent_snapshot(sid)

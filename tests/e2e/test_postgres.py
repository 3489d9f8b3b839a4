"""Real server processes on PostgreSQL (``DEX_DATABASE``): turns run, a SIGKILLed server
restarted on the same database recovers what it was doing, and of two servers on one
database one leads while the other waits to take over."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import dex
from dex.testing import wait_until
from dex.testing.harness import ServerProcess
from tests.support.rig import Rig, attempts, results


def test_a_server_on_postgres_runs_turns_and_recovers_after_a_kill(
    rig: Rig, postgres_url: str
) -> None:
    rig.server.env["DEX_DATABASE"] = postgres_url
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    assert rig.client.send_message(sid, "hello", wait=True)["text"] == "echo: hello"
    turn = rig.call(sid, ("lookup", {"key": "a", "gate": "g"}))
    rig.wait_entered("g", 1)

    rig.restart_server()  # SIGKILL while the tool runs, then start on the same database
    rig.open_gate("g")

    t = rig.wait_turn(sid, turn)
    # the Worker lived through the kill and reclaimed the attempt: the read ran once
    assert attempts(t, "CallTool")[0] == [(1, "succeeded")]
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]
    assert results(t)[0]["status"] == "succeeded"
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history][:2] == ["user", "assistant"]
    assert [r["id"] for r in rig.client.list_sessions()["sessions"]] == [sid]
    assert not (rig.tmp / "data" / "dex.sqlite3").exists()  # it ran on PostgreSQL


def readyz(server: ServerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(server.address + "/readyz", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_two_servers_on_one_postgres_one_leads_and_the_other_takes_over_when_it_dies(
    tmp_path: Path, postgres_url: str
) -> None:
    first = ServerProcess(tmp_path / "a", database=postgres_url, standby=True).start()
    second = ServerProcess(tmp_path / "b", database=postgres_url, standby=True)
    try:
        assert readyz(first) == (200, {"status": "ready", "role": "active", "epoch": 1})
        with dex.SyncClient(first.address) as client:
            assert client.list_sessions() == {"sessions": [], "next_cursor": None}

        second.start(ready=False)  # it answers, and waits for the lease as a standby
        assert not second.ready()
        assert readyz(second) == (503, {"status": "not ready", "role": "standby"})

        first.kill()
        killed = time.monotonic()
        wait_until(second.ready, 10, 0.02, "the standby took over")
        took = time.monotonic() - killed

        assert took < 2.0, f"took over in {took:.2f}s"
        assert readyz(second) == (200, {"status": "ready", "role": "active", "epoch": 2})
    finally:
        first.kill()
        second.kill()

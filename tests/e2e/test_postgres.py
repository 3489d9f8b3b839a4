"""A real server process on PostgreSQL (``DEX_DATABASE``): turns run, and a SIGKILLed server
restarted on the same database recovers what it was doing."""

from __future__ import annotations

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
    assert attempts(t, "CallTool")[0][0] == (1, "failed")  # the attempt the kill cut off
    assert results(t)[0]["status"] == "succeeded"  # a read runs again
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history][:2] == ["user", "assistant"]
    assert [r["id"] for r in rig.client.list_sessions()] == [sid]
    assert not (rig.tmp / "data" / "dex.sqlite3").exists()  # it ran on PostgreSQL

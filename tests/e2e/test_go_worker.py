"""A Worker built with the Go SDK (``sdk/go``) against a real server: a whole turn, and a
server SIGKILLed and restarted while the Go Worker holds an attempt."""

from __future__ import annotations

import signal

from tests.support.rig import Rig, attempts, results


def test_go_worker_serves_a_turn_model_tool_model(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker(language="go")
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k"}), ("upsert", {"key": "order-1"}))
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert attempts(t, "RunModel") == [[(1, "succeeded")], [(1, "succeeded")]]
    assert results(t) == [
        {
            "name": "lookup",
            "status": "succeeded",
            "result": {"key": "k", "value": "K"},
            "error": None,
        },
        {"name": "upsert", "status": "succeeded", "result": "stored order-1", "error": None},
    ]
    (upsert,) = rig.ledger.entries("upsert")
    assert upsert["idempotency_key"] == t["tool_calls"][1]["idempotency_key"]
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "thanks")["turn"])
    assert follow["text"] == "echo: thanks"


def test_go_worker_outlives_a_server_restart_while_it_holds_an_attempt(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker(language="go")
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-9", "gate": "g"}))
    rig.wait_entered("g", 1)

    rig.restart_server()  # the Go Worker reconnects by itself; Dex fails attempt 1
    rig.wait_entered("g", 2)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]
    assert results(t)[0]["status"] == "succeeded"
    assert {e["idempotency_key"] for e in rig.ledger.entries("upsert")} == {
        t["tool_calls"][0]["idempotency_key"]
    }
    assert worker.alive  # the same process served attempt 2
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "still there?")["turn"])
    assert follow["text"] == "echo: still there?"


def test_go_worker_drains_on_sigterm(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker(language="go")
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-3", "gate": "g"}))
    rig.wait_entered("g", 1)

    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)  # drain: the running attempt finishes
    rig.open_gate("g")
    assert worker.proc.wait(20) == 0
    rig.start_worker(language="go")  # the turn's next model call runs here
    t = rig.wait_turn(sid, turn)

    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("upsert")] == [1]

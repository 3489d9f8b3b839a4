"""CallSingleAttemptTool (kind write): a crash records outcome_unknown, never a second run."""

from __future__ import annotations

from tests.crash.helpers import columns, interrupt
from tests.support.rig import Rig, attempts, results


@columns("single_attempt.running", takeover=True, typescript=True, go=True)
def test_write_interrupted_while_running_is_unknown_and_never_runs_again(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 30, "gate": "g"}))
    rig.wait_entered("g", 1)

    interrupt(rig, column, worker)
    t = rig.wait_turn(sid, turn)
    rig.open_gate(
        "g"
    )  # a Worker that ran on through a takeover was told to stop: nothing more runs

    (call,) = t["tool_calls"]
    assert call["status"] == "outcome_unknown"
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "failed")]]
    assert t["steps"][1]["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert results(t)[0]["status"] == "outcome_unknown"  # what the model saw
    # The next turn runs normally, and the charge never ran a second time.
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "anything else?")["turn"])
    assert follow["text"] == "echo: anything else?"
    assert [e["attempt"] for e in rig.ledger.entries("charge")] == [1]


@columns("single_attempt.before_heartbeat", takeover=True, typescript=True, go=True)
def test_write_interrupted_before_first_heartbeat_is_unknown_and_never_runs(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker(failpoints="worker.before_first_heartbeat=pause")
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 40}))
    rig.wait_failpoint("worker.before_first_heartbeat")

    interrupt(rig, column, worker)
    t = rig.wait_turn(sid, turn)
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "still there?")["turn"])

    (call,) = t["tool_calls"]
    assert call["status"] == "outcome_unknown"
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "failed")]]
    assert results(t)[0]["status"] == "outcome_unknown"
    assert follow["status"] == "completed"
    assert rig.ledger.entries("charge") == []

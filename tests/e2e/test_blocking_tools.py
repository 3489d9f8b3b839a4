"""Plain-function (``def``) tools block only their own thread, never the Worker: its
heartbeats and its other Steps go on while such a tool sleeps, computes or waits."""

from __future__ import annotations

from dex.testing import wait_until
from tests.support.rig import HEARTBEAT_TIMEOUT, Rig, attempts, results


def test_a_blocking_def_write_outlives_the_heartbeat_timeout_and_succeeds_once(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    seconds = 2 * HEARTBEAT_TIMEOUT
    t = rig.wait_turn(sid, rig.call(sid, ("slow_charge", {"amount": 7, "seconds": seconds})))

    (seen,) = results(t)
    assert (seen["status"], seen["result"]) == ("succeeded", "charged 7 slowly")
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "succeeded")]]
    # the tool's own ledger: it ran exactly once, to its end
    assert [e["amount"] for e in rig.ledger.entries("slow_charge")] == [7]
    assert [e["amount"] for e in rig.ledger.entries("slow_charge.done")] == [7]


def test_the_worker_serves_other_sessions_while_a_def_tool_blocks(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    blocked = rig.session()
    turn = rig.call(blocked, ("slow_charge", {"amount": 9, "gate": "g"}))
    rig.wait_entered("g", 1)

    other = rig.session()
    reply = rig.client.send_message(other, "still there?", wait=True, timeout=10)
    assert reply["text"] == "echo: still there?"
    assert rig.ledger.entries("slow_charge.done") == []  # the tool still blocks its thread

    rig.open_gate("g")
    t = rig.wait_turn(blocked, turn)
    assert results(t)[0]["status"] == "succeeded"
    assert len(rig.ledger.entries("slow_charge.done")) == 1


def test_a_def_tool_asks_a_question_and_the_answer_resumes_it(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("slow_order", {"item": "hat"}))
    wait_until(lambda: rig.client.get_agent_snapshot(sid)["waits"], 10, what="the question")
    (wait,) = rig.client.get_agent_snapshot(sid)["waits"]
    assert wait["question"] == "Which size of hat?" and wait["choices"] == ["S", "M", "L"]
    rig.client.answer(sid, str(wait["call_id"]), "L")
    t = rig.wait_turn(sid, turn)

    assert results(t)[0]["result"] == "ordered hat in L"
    assert [e["answers"] for e in rig.ledger.entries("slow_order.before_ask")] == [0, 1]
    assert len(rig.ledger.entries("slow_order")) == 1

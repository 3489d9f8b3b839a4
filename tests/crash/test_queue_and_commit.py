"""A queued Step uses no attempt; a sent result is either committed or its attempt fails."""

from __future__ import annotations

from dex.testing import wait_until
from tests.crash.helpers import (
    SERVER_SIDE,
    WORKER_KILL,
    columns,
    workers_connected,
)
from tests.support.rig import Rig, attempts, model_calls, results


@columns("any_step.queued", takeover=True, typescript=True, go=True)
def test_queued_step_uses_no_attempt_and_runs_as_attempt_1(rig: Rig, column: str) -> None:
    rig.start_server()
    # The one Worker has room for one attempt, which a tool held at a gate in another
    # session fills: the Step waits in the queue for that Worker, connected and serving it.
    worker = rig.start_worker(capacity=1)
    busy = rig.session()
    busy_turn = rig.call(busy, ("lookup", {"key": "b", "gate": "busy"}))
    rig.wait_entered("busy", 1)
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "q"}))

    def queued_for(what: str) -> bool:
        snap = rig.client.get_agent_snapshot(sid)
        steps = (snap["current_turn"] or {}).get("steps", [])
        return [s["status"] for s in steps] == ["queued"] and [
            w["waiting_for"] for w in snap["waiting"]
        ] == [what]

    wait_until(lambda: queued_for("a free Worker"), 10, what="the step waits for the busy Worker")
    if column == WORKER_KILL:
        # the Worker it waits for dies; nobody serves the agent now
        worker.kill()
        wait_until(lambda: workers_connected(rig) == 0, 10, what="the killed Worker's link closed")
        assert queued_for("a Worker that serves model:assistant")
        (step,) = rig.client.get_agent_snapshot(sid)["current_turn"]["steps"]
        assert step["attempts"] == []
        rig.start_worker()
    else:
        # the node dies; meanwhile the held tool ends on the Worker, which reconnects to
        # the node that serves next with room for the queued Step
        rig.server.kill()
        rig.open_gate("busy")
        rig.recover_server()
    rig.open_gate("busy")
    t = rig.wait_turn(sid, turn)

    # the queued Step used no attempt: its first ran, and succeeded
    assert attempts(t, "RunModel") == [[(1, "succeeded")], [(1, "succeeded")]]
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert model_calls(rig, sid) == [1, 1]  # the model's own count: each call once
    assert [e["attempt"] for e in rig.ledger.entries("lookup") if e["key"] == "q"] == [1]
    busy_attempts = attempts(rig.wait_turn(busy, busy_turn), "CallTool")
    busy_runs = [e["attempt"] for e in rig.ledger.entries("lookup") if e["key"] == "b"]
    if column in SERVER_SIDE:
        # the Worker lived through the node's failure and reclaimed the held tool's
        # attempt: its result was kept, and it ran once
        assert (busy_attempts, busy_runs) == ([[(1, "succeeded")]], [1])
    else:
        # the held tool's attempt was interrupted and ran again, once
        assert (busy_attempts, busy_runs) == ([[(1, "failed"), (2, "succeeded")]], [1, 2])


@columns("any_step.result_sent", takeover=True, typescript=True, go=True)
def test_sent_result_is_committed_or_its_attempt_fails(rig: Rig, column: str) -> None:
    if column in SERVER_SIDE:
        # the server dies on receiving the tool's result (the 2nd result of the turn)
        rig.start_server(failpoints="server.before_commit_result=crash@2")
        worker = rig.start_worker()
    else:
        rig.start_server()
        worker = rig.start_worker(failpoints="worker.after_send_result=crash@2")
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "r"}))
    if column in SERVER_SIDE:
        wait_until(lambda: not rig.server.alive, 20, what="the server crashed at the failpoint")
        rig.recover_server()
    else:
        wait_until(lambda: not worker.alive, 20, what="the Worker crashed at the failpoint")
        rig.start_worker()
    t = rig.wait_turn(sid, turn)

    (tool_attempts,) = attempts(t, "CallTool")
    ran = [e["attempt"] for e in rig.ledger.entries("lookup")]
    # No third case: either attempt 1's result was committed, or attempt 1 failed and the
    # read ran again. The ledger agrees with the record either way.
    assert tool_attempts in ([(1, "succeeded")], [(1, "failed"), (2, "succeeded")])
    assert ran == [a for a, _ in tool_attempts]
    if column in SERVER_SIDE:
        # the Worker lived through the node's failure, reclaimed the attempt and sent its
        # result again: committed by the node that serves next
        assert tool_attempts == [(1, "succeeded")]
    assert results(t)[0]["status"] == "succeeded"

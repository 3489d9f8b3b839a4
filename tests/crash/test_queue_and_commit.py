"""A queued Step uses no attempt; a sent result is either committed or its attempt fails."""

from __future__ import annotations

from dex.testing import wait_until
from tests.crash.helpers import SERVER_SIDE, WORKER_KILL, columns
from tests.support.rig import Rig, attempts, results


@columns("any_step.queued", takeover=True, typescript=True, go=True)
def test_queued_step_uses_no_attempt_and_runs_as_attempt_1(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    worker.kill()  # nobody serves the agent now
    turn = rig.call(sid, ("lookup", {"key": "q"}))

    def queued() -> bool:
        snap = rig.client.get_agent_snapshot(sid)
        steps = snap["current_turn"]["steps"]
        return bool(snap["waiting"]) and steps[0]["status"] == "queued"

    wait_until(queued, 10, what="the RunModel step waits in the queue")
    if column == WORKER_KILL:
        rig.start_worker().kill()  # a Worker that comes and dies without taking it
    else:
        rig.restart_server()
    snap = rig.client.get_agent_snapshot(sid)
    (step,) = snap["current_turn"]["steps"]
    assert step["status"] == "queued" and step["attempts"] == []
    assert snap["waiting"][0]["waiting_for"] == "a Worker that serves model:assistant"

    rig.start_worker()
    t = rig.wait_turn(sid, turn)
    assert attempts(t, "RunModel") == [[(1, "succeeded")], [(1, "succeeded")]]
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]


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
        assert tool_attempts == [(1, "failed"), (2, "succeeded")]  # never committed
    assert results(t)[0]["status"] == "succeeded"

"""A Worker that lives through a node's restart reclaims the attempt it runs: the tool (or
model call) runs once and its result is kept, write tools included. (When the Worker dies
with the node, the attempt fails as each row's other tests show.)"""

from __future__ import annotations

from dex.testing import wait_until
from tests.crash.helpers import columns
from tests.support.rig import Rig, attempts, metric, model_calls, results


def reclaimed(rig: Rig) -> int:
    """How many attempts the serving node has let a Worker reclaim."""
    return int(metric(rig, "dex_attempts_reclaimed_total"))


def restart_and_reclaim(rig: Rig) -> None:
    """SIGKILL the node and restart it on its storage; return once the Worker, which ran
    on, has reconnected and reclaimed its attempt."""
    rig.restart_server()
    wait_until(lambda: reclaimed(rig) == 1, 20, what="the Worker reclaimed its attempt")


@columns("single_attempt.running", worker_kill=False, reclaim=True, typescript=True, go=True)
def test_write_running_through_a_restart_is_reclaimed_and_its_result_kept(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 30, "gate": "g"}))
    rig.wait_entered("g", 1)

    restart_and_reclaim(rig)
    rig.open_gate("g")  # the body ends after the restart: its result reaches the new node
    t = rig.wait_turn(sid, turn)

    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "succeeded")]]
    assert results(t)[0]["status"] == "succeeded"  # what the model saw
    assert [e["attempt"] for e in rig.ledger.entries("charge")] == [1]


@columns(
    "single_attempt.before_heartbeat",
    worker_kill=False,
    reclaim=True,
    typescript=True,
    go=True,
)
def test_write_not_yet_started_at_a_restart_starts_once_after_its_reclaim(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker(failpoints="worker.before_first_heartbeat=pause")
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 40}))
    rig.wait_failpoint("worker.before_first_heartbeat")

    rig.restart_server()
    # the paused Worker goes on: it reconnects, reclaims the attempt, asks to start, and
    # the node that came back says yes (it holds the lease)
    rig.release_failpoint("worker.before_first_heartbeat")
    t = rig.wait_turn(sid, turn)

    assert reclaimed(rig) == 1
    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert attempts(t, "CallSingleAttemptTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("charge")] == [1]
    assert "no longer runs this attempt" not in worker.output()


@columns("idempotent_write.running", worker_kill=False, reclaim=True, typescript=True, go=True)
def test_idempotent_write_running_through_a_restart_runs_once(rig: Rig, column: str) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-9", "gate": "g"}))
    rig.wait_entered("g", 1)

    restart_and_reclaim(rig)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("upsert")] == [1]


@columns("read.running", worker_kill=False, reclaim=True, typescript=True, go=True)
def test_read_running_through_a_restart_runs_once(rig: Rig, column: str) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    restart_and_reclaim(rig)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]


@columns("run_model.before_output", worker_kill=False, reclaim=True, typescript=True, go=True)
def test_model_call_through_a_restart_runs_once(rig: Rig, column: str) -> None:
    rig.start_server()
    rig.start_worker(failpoints="worker.run_model.before_output=pause")
    sid = rig.session()
    turn = rig.client.send_message(sid, "hello")["turn"]
    rig.wait_failpoint("worker.run_model.before_output")

    rig.restart_server()
    rig.release_failpoint("worker.run_model.before_output")
    t = rig.wait_turn(sid, turn)

    assert t["text"] == "echo: hello"
    assert attempts(t, "RunModel") == [[(1, "succeeded")]]
    assert model_calls(rig, sid) == [1]  # the model's own count

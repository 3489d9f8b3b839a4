"""CallTool (kinds read and idempotent_write): a crash runs the call again, with the same
idempotency key; after the last attempt a read records failed, a write outcome_unknown."""

from __future__ import annotations

from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from tests.crash.helpers import columns, interrupt
from tests.support.rig import Rig, attempts, results


@columns("idempotent_write.running", takeover=True, typescript=True, go=True)
def test_idempotent_write_interrupted_while_running_runs_again_with_same_key(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-7", "gate": "g"}))
    rig.wait_entered("g", 1)

    interrupt(rig, column, worker)
    rig.wait_entered("g", 2)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    effects = rig.ledger.entries("upsert")
    assert [e["attempt"] for e in effects] == [1, 2]
    (call,) = t["tool_calls"]
    assert {e["idempotency_key"] for e in effects} == {call["idempotency_key"]}
    assert call["status"] == "succeeded"
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]
    first = t["steps"][1]["attempts"][0]
    assert first["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert results(t) == [
        {"name": "upsert", "status": "succeeded", "result": "stored order-7", "error": None}
    ]


@columns("idempotent_write.before_heartbeat", takeover=True, typescript=True, go=True)
def test_idempotent_write_interrupted_before_first_heartbeat_runs_again_with_same_key(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker(failpoints="worker.before_first_heartbeat=pause")
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-8"}))
    rig.wait_failpoint("worker.before_first_heartbeat")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.before_first_heartbeat")  # a still-running Worker goes on
    t = rig.wait_turn(sid, turn)

    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    effects = rig.ledger.entries("upsert")
    assert {e["idempotency_key"] for e in effects} == {call["idempotency_key"]}
    # A killed Worker never ran the body; a Worker that ran on through a takeover, released, ran
    # attempt 1 late (its result was refused) and attempt 2, with the same key (in a
    # cluster, in either order: the new owner may hand attempt 2 out while it is paused).
    ran = sorted(e["attempt"] for e in effects)
    assert ran == [2]
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]


@columns("read.running", takeover=True, typescript=True, go=True)
def test_read_interrupted_while_running_runs_again(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    interrupt(rig, column, worker)
    rig.wait_entered("g", 2)
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1, 2]
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]
    assert results(t) == [
        {
            "name": "lookup",
            "status": "succeeded",
            "result": {"key": "k", "value": "K"},
            "error": None,
        }
    ]


@columns("read_poll_compact.before_heartbeat", takeover=True, typescript=True, go=True)
def test_read_interrupted_before_first_heartbeat_runs_again(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker(failpoints="worker.before_first_heartbeat=pause")
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k"}))
    rig.wait_failpoint("worker.before_first_heartbeat")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.before_first_heartbeat")
    t = rig.wait_turn(sid, turn)

    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "succeeded")]]
    # as for the idempotent write: attempt 1 ran late only on a Worker that ran on through
    # a takeover
    # (in a cluster the new owner may hand attempt 2 to the paused Worker before attempt 1
    # runs on: the two then run in either order)
    ran = sorted(e["attempt"] for e in rig.ledger.entries("lookup"))
    assert ran == [2]
    assert results(t)[0]["status"] == "succeeded"


@columns("call_tool.every_attempt", takeover=True, typescript=True, go=True)
def test_every_attempt_interrupted_read_fails_and_write_is_unknown(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(
        sid, ("lookup", {"key": "k", "gate": "r"}), ("upsert", {"key": "u", "gate": "w"})
    )
    for attempt in (1, 2, 3):  # both tools allow 3 attempts
        rig.wait_entered("r", attempt)
        rig.wait_entered("w", attempt)
        worker = interrupt(rig, column, worker)
    t = rig.wait_turn(sid, turn)

    read, write = t["tool_calls"]
    assert read["status"] == "failed"
    assert not read["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert write["status"] == "outcome_unknown"
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1, 2, 3]
    assert [e["attempt"] for e in rig.ledger.entries("upsert")] == [1, 2, 3]
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "failed"), (3, "failed")]] * 2
    seen = {r["name"]: r["status"] for r in results(t)}
    assert seen == {"lookup": "failed", "upsert": "outcome_unknown"}

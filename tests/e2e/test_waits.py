"""Approvals, questions, durable timers, tool tasks, checks, compaction, cancel and
reconcile, end to end with real processes."""

from __future__ import annotations

import pytest

import dex
from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex.testing import wait_until
from tests.support.rig import Rig, results

LANGUAGES = pytest.mark.parametrize(
    "worker_language", ["python", "typescript", "go"], indirect=True
)
"""The same test against each Worker: Python's, and the TypeScript and Go SDKs' ports of
the test agents (``tests.support.rig.SDK_AGENTS``)."""


def waits(rig: Rig, sid: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = rig.client.get_agent_snapshot(sid)["waits"]
    return found


def test_a_tool_that_needs_approval_runs_once_after_approval(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("delete_all", {}))
    wait_until(lambda: rig.client.list_approvals(sid), 10, what="an approval is pending")
    (pending,) = rig.client.list_approvals(sid)
    (wait,) = waits(rig, sid)
    assert wait["type"] == "AwaitToolApproval" and wait["call_id"] == pending["call_id"]
    assert rig.ledger.entries("delete_all") == []  # nothing runs while it waits

    with pytest.raises(dex.Conflict, match="other arguments"):
        rig.client.approve(sid, pending["call_id"], arguments_hash="0" * 64)
    rig.client.approve(
        sid, pending["call_id"], by="alice", arguments_hash=pending["arguments_hash"]
    )
    with pytest.raises(dex.Conflict):
        rig.client.approve(sid, pending["call_id"], by="alice")  # twice: refused
    t = rig.wait_turn(sid, turn)

    assert len(rig.ledger.entries("delete_all")) == 1
    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert call["approval"]["approved"] is True and call["approval"]["by"] == "alice"
    assert call["approval"]["arguments_hash"] == pending["arguments_hash"]
    assert [s["type"] for s in t["steps"]] == [
        "RunModel",
        "AwaitToolApproval",
        "CallSingleAttemptTool",
        "RunModel",
    ]


def test_an_approval_predicate_decides_per_call_and_a_denial_reaches_the_model(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    small = rig.wait_turn(sid, rig.call(sid, ("transfer", {"amount": 50})))
    assert results(small)[0]["status"] == "succeeded"  # under the threshold: no approval

    turn = rig.call(sid, ("transfer", {"amount": 500}))
    wait_until(lambda: rig.client.list_approvals(sid), 10, what="an approval is pending")
    (pending,) = rig.client.list_approvals(sid)
    rig.client.deny(sid, pending["call_id"], "too much money", by="bob")
    t = rig.wait_turn(sid, turn)
    (seen,) = results(t)
    assert seen["status"] == "denied" and "too much money" in seen["error"]
    assert [e["amount"] for e in rig.ledger.entries("transfer")] == [50]


def test_a_question_pauses_the_call_and_the_answer_resumes_it(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("order", {"item": "shirt"}))
    wait_until(lambda: waits(rig, sid), 10, what="the question waits")
    (wait,) = waits(rig, sid)
    assert wait["type"] == "AwaitQuestionAnswer"
    assert wait["question"] == "Which size of shirt?" and wait["choices"] == ["S", "M", "L"]
    call_id = str(wait["call_id"])
    with pytest.raises(dex.Conflict, match="one of"):
        rig.client.answer(sid, call_id, "XXL")
    rig.client.answer(sid, call_id, "M", by="carol")
    t = rig.wait_turn(sid, turn)

    assert results(t)[0]["result"] == "ordered shirt in M"
    assert [e["answers"] for e in rig.ledger.entries("order.before_ask")] == [0, 1]
    assert len(rig.ledger.entries("order")) == 1


def test_a_durable_timer_fires_once(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("remind", {"seconds": 0.5}))
    wait_until(lambda: waits(rig, sid), 10, what="the timer waits")
    (wait,) = waits(rig, sid)
    assert wait["type"] == "AwaitTimer"
    assert float(wait["deadline"]) - float(wait["since"]) == pytest.approx(0.5)  # type: ignore[arg-type]
    t = rig.wait_turn(sid, turn)
    assert results(t)[0]["result"] == "time is up"
    assert len(rig.ledger.entries("remind")) == 1
    (timer,) = [s for s in t["steps"] if s["type"] == "AwaitTimer"]
    assert timer["wait"]["resolved_at"] >= timer["wait"]["deadline"]


def test_a_task_is_started_once_and_polled_until_done(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("render", {"scene": "intro"}))
    wait_until(lambda: len(rig.ledger.entries("render.poll")) >= 3, 10, what="polls")
    handle = rig.ledger.entries("render.start")[0]["idempotency_key"]
    (rig.gates / f"{handle.replace('/', '_')}.done").write_text("")
    t = rig.wait_turn(sid, turn)

    assert results(t)[0]["result"] == f"rendered {handle}"
    assert len(rig.ledger.entries("render.start")) == 1
    assert {e["handle"] for e in rig.ledger.entries("render.poll")} == {handle}
    (poll,) = [s for s in t["steps"] if s["type"] == "PollToolTask"]
    assert poll["polls"] >= 2


@LANGUAGES
def test_a_check_settles_an_unknown_outcome(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("pay", {"amount": 9, "gate": "g"}))
    rig.wait_entered("g", 1)
    worker.kill()  # the payment happened, but its result is lost
    rig.start_worker()
    t = rig.wait_turn(sid, turn)

    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert call["reconciled"]["by"] == "check"
    assert results(t)[0]["result"] == "paid 9 (found by check)"  # what the model saw
    assert len(rig.ledger.entries("pay")) == 1
    assert [s["type"] for s in t["steps"]] == [
        "RunModel",
        "CallSingleAttemptTool",
        "CheckToolCall",
        "RunModel",
    ]


def test_reconcile_records_what_happened_and_the_model_is_told(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 5, "gate": "g"}))
    rig.wait_entered("g", 1)
    worker.kill()
    rig.start_worker()
    t = rig.wait_turn(sid, turn)
    (call,) = t["tool_calls"]
    assert call["status"] == "outcome_unknown"

    with pytest.raises(dex.NotFound):
        rig.client.reconcile(sid, "9.9", status="succeeded")
    done = rig.client.reconcile(sid, call["id"], status="succeeded", result="charged 5", by="ops")
    assert done["status"] == "succeeded" and done["reconciled"]["by"] == "ops"
    with pytest.raises(dex.Conflict):
        rig.client.reconcile(sid, call["id"], status="failed")
    note = rig.client.get_agent_snapshot(sid)["history"][-1]
    assert note["type"] == "note" and "reconciled by ops" in note["text"]
    assert rig.client.wait_turn(sid, turn)["tool_calls"][0]["status"] == "succeeded"
    assert len(rig.ledger.entries("charge")) == 1


@LANGUAGES
def test_cancel_stops_running_work_and_fails_what_never_ran(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("charge", {"amount": 7, "gate": "g"}), ("delete_all", {}))
    rig.wait_entered("g", 1)
    wait_until(lambda: rig.client.list_approvals(sid), 10, what="an approval is pending")
    rig.client.cancel_turn(sid, "the user changed their mind")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "cancelled"
    running, waiting = t["tool_calls"]
    assert running["status"] == "outcome_unknown"  # it may have run
    assert waiting["status"] == "failed"
    assert waiting["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    wait_until(
        lambda: "cancelled by the server" in worker.output(),
        10,
        what="the Worker stopped the running tool",
    )
    with pytest.raises(dex.Conflict):
        rig.client.cancel_turn(sid)  # nothing runs now
    assert rig.wait_turn(sid, rig.client.send_message(sid, "next")["turn"])["status"] == "completed"


def test_compaction_stores_one_summary_and_the_model_sees_it(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("compactor")
    for i in range(6):
        rig.wait_turn(sid, rig.client.send_message(sid, f"message number {i} " + "x" * 60)["turn"])
    history = rig.client.get_agent_snapshot(sid)["history"]
    summaries = [i for i, item in enumerate(history) if item["type"] == "summary"]
    assert summaries, "the history passed the threshold but was never compacted"
    turns = [rig.client.wait_turn(sid, n) for n in range(1, 7)]
    # the model answered every message, also those after a compaction
    assert [t["text"] for t in turns] == [f"echo: message number {i} " + "x" * 60 for i in range(6)]
    compactions = [s for t in turns for s in t["steps"] if s["type"] == "CompactContext"]
    assert len(compactions) == len(summaries)  # one summary per compaction
    assert all(s["status"] == "succeeded" for s in compactions)
    assert "message number 0" in history[summaries[0]]["text"]


def test_when_every_summary_attempt_fails_the_turn_fails_and_the_next_compacts_again(
    rig: Rig,
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("broken_summaries")
    statuses = [
        rig.wait_turn(sid, rig.client.send_message(sid, "y" * 150)["turn"])["status"]
        for _ in range(4)
    ]
    assert statuses[0] == "completed" and statuses[-1] == "failed"
    last = rig.client.wait_turn(sid, 4)
    (compact,) = [s for s in last["steps"] if s["type"] == "CompactContext"]
    assert [a["outcome"] for a in compact["attempts"]] == ["failed"] * 3
    assert all(i["type"] != "summary" for i in rig.client.get_agent_snapshot(sid)["history"])


def test_the_model_sets_itself_a_timer_with_the_ready_made_timer_tool(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("set_timer", {"seconds": 0.3}))
    wait_until(lambda: waits(rig, sid), 10, what="the timer waits")
    assert waits(rig, sid)[0]["type"] == "AwaitTimer"
    t = rig.wait_turn(sid, turn)
    assert results(t)[0]["result"] == "the 0.3 s timer fired"
    bad = rig.wait_turn(sid, rig.call(sid, ("set_timer", {"seconds": -1})))
    assert "between 0 and" in results(bad)[0]["error"]

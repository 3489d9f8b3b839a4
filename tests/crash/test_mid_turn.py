"""Messages mid-turn across crashes (docs/mid-turn.md): a message that interrupts a running
turn cancels it and starts its own in the commit that acknowledges the send, so a crash
right after the acknowledgement finds the old turn cancelled once and the new one to run
once; a message steered into a running turn is recorded with the turn, so the turn's next
model call sees it once, and the turn completes once. A client that sends again with the
same message_id after the crash gets the same answer, and nothing is applied twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests.crash.helpers import columns, interrupt
from tests.support.rig import Rig, attempts, model_calls

PAUSE_MODEL = "worker.run_model.before_output"


def running_turn(rig: Rig, moment: str, tool: str, gate: str) -> tuple[Any, str, int]:
    """A session whose turn 1 runs: its ``tool`` behind ``gate`` (``moment`` ``tool``), or
    its model call, paused in the Worker before any output (``model``). Returns the
    Worker, the session and the turn."""
    rig.start_server()
    if moment == "model":
        worker = rig.start_worker(failpoints=f"{PAUSE_MODEL}=pause")
        sid = rig.session()
        turn: int = rig.client.send_message(sid, "hello")["turn"]
        rig.wait_failpoint(PAUSE_MODEL)
    else:
        worker = rig.start_worker()
        sid = rig.session()
        args = {"amount": 30} if tool == "charge" else {"key": "k"}
        turn = rig.call(sid, (tool, {**args, "gate": gate}))
        rig.wait_entered(gate, 1)
    return worker, sid, turn


def users(history: list[dict[str, Any]]) -> list[str]:
    return [i["text"] for i in history if i["type"] == "user"]


@columns("mid_turn.interrupt", takeover=True)
@pytest.mark.parametrize("moment", ["tool", "model"])
def test_a_message_that_interrupts_a_turn_cancels_it_once_and_runs_its_own_once(
    rig: Rig, column: str, moment: str
) -> None:
    worker, sid, old = running_turn(rig, moment, "charge", "g")
    sent = rig.client.send_message(sid, "stop", message_id="m-stop", on_busy="interrupt")
    assert (sent["outcome"], sent["interrupted"], sent["turn"]) == ("interrupted", old, old + 1)

    interrupt(rig, column, worker)  # right after the acknowledgement
    # the client did not hear the answer, say, and sends again: the same answer, applied once
    again = rig.client.send_message(sid, "stop", message_id="m-stop", on_busy="interrupt")
    rig.open_gate("g")  # nothing of the old turn runs on: its attempt was cancelled
    new = rig.wait_turn(sid, sent["turn"])
    cancelled = rig.client.wait_turn(sid, old, timeout=0)

    assert again["created"] is False
    assert (again["outcome"], again["interrupted"], again["turn"]) == ("interrupted", old, old + 1)
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"] == f"cancelled: interrupted by message {old + 1}"
    assert new["status"] == "completed" and new["text"] == "echo: stop"
    runs = attempts(new, "RunModel")
    assert len(runs) == 1 and runs[0][-1][1] == "succeeded"  # one model call, retried at most
    assert all(outcome == "failed" for _, outcome in runs[0][:-1])
    snapshot = rig.client.get_agent_snapshot(sid)
    assert snapshot["session"]["messages_received"] == 2
    assert snapshot["session"]["status"] == "idle" and snapshot["session"]["queued_messages"] == []
    history = snapshot["history"]
    assert users(history)[1:] == ["stop"]  # the new turn's message, once
    answers = [i["text"] for i in history if i["type"] == "assistant" and i["text"]]
    assert answers == ["echo: stop"]
    if moment == "tool":
        # the write that ran when the turn was cancelled: outcome_unknown, and it never ran
        # again (the tool's own ledger)
        [charge] = cancelled["tool_calls"]
        assert charge["status"] == "outcome_unknown"
        assert attempts(cancelled, "CallSingleAttemptTool") == [[(1, "cancelled")]]
        assert [e["attempt"] for e in rig.ledger.entries("charge")] == [1]
        assert [i["type"] for i in history].count("note") == 1  # the call may have run
    else:
        assert attempts(cancelled, "RunModel") == [[(1, "cancelled")]]
        # the paused Worker made no call; the new turn's model call ran once
        assert len(model_calls(rig, sid)) == 1


@columns("mid_turn.steer", takeover=True)
@pytest.mark.parametrize("moment", ["tool", "model"])
def test_a_message_steered_into_a_turn_is_seen_once_and_the_turn_completes_once(
    rig: Rig, column: str, moment: str
) -> None:
    worker, sid, turn = running_turn(rig, moment, "lookup", "g")
    sent = rig.client.send_message(sid, "in French", message_id="m-steer", on_busy="steer")
    assert (sent["outcome"], sent["turn"]) == ("steered", turn)

    interrupt(rig, column, worker)  # right after the acknowledgement
    again = rig.client.send_message(sid, "in French", message_id="m-steer", on_busy="steer")
    rig.open_gate("g")  # the read runs again after a crash: let it end
    if moment == "model":
        rig.release_failpoint(PAUSE_MODEL)
    t = rig.wait_turn(sid, turn)

    assert (again["created"], again["outcome"], again["turn"]) == (False, "steered", turn)
    assert t["status"] == "completed" and t["text"] == "echo: in French"
    snapshot = rig.client.get_agent_snapshot(sid)
    assert snapshot["session"]["messages_received"] == 1  # no turn of its own
    assert snapshot["current_turn"] is None
    history = snapshot["history"]
    assert users(history).count("in French") == 1
    kinds = [i["type"] for i in history]
    # the steered message comes before the turn's last model call, after what ran before it
    if moment == "tool":
        assert kinds == ["user", "assistant", "tool_result", "user", "assistant"]
        assert history[2]["status"] == "succeeded"
    else:
        assert kinds == ["user", "assistant", "user", "assistant"]
        assert history[1]["text"] == "echo: hello"  # the interrupted call's answer stands
    assert history[-2]["text"] == "in French"
    # the turn's model calls: each RunModel Step succeeded once
    assert all(runs[-1][1] == "succeeded" for runs in attempts(t, "RunModel"))
    assert len(attempts(t, "RunModel")) == 2

"""Waits that live in Dex Server (an approval, an answer, a timer, the next user message):
a crash runs nothing again, and the wait goes on. A wait's resolution is recorded before
the handler that moves the turn on runs; a crash in that handler runs it again and keeps
the recorded resolution."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from dex.testing import wait_until
from tests.crash.helpers import (
    SERVER_RESTART,
    columns,
    interrupt,
    interrupt_and_reconnect,
)
from tests.support.rig import TAKEOVER, Rig, attempts, results


def waits(rig: Rig, sid: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = rig.client.get_agent_snapshot(sid)["waits"]
    return found


def steps(turn: dict[str, Any]) -> list[tuple[str, list[tuple[int, str]]]]:
    """Every Step of the turn in order, with the (number, outcome) of its attempts."""
    return [
        (s["type"], [(a["number"], a["outcome"]) for a in s["attempts"]]) for s in turn["steps"]
    ]


def assert_nothing_ran_again(before: dict[str, Any], after: dict[str, Any]) -> None:
    """The snapshot after the crash shows the same wait and the same Steps, and nothing runs."""
    assert after["waits"] == before["waits"]
    assert after["current_turn"]["steps"] == before["current_turn"]["steps"]
    assert after["running"] == [] and after["waiting"] == []


ONE = [(1, "succeeded")]


@columns("await_tool_approval.waiting", takeover=True, typescript=True, go=True)
def test_approval_wait_survives_and_a_later_approval_runs_the_tool_once(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("delete_all", {}))
    wait_until(lambda: rig.client.list_approvals(sid), 10, what="an approval is pending")
    before = rig.client.get_agent_snapshot(sid)

    interrupt_and_reconnect(rig, column, worker)
    assert_nothing_ran_again(before, rig.client.get_agent_snapshot(sid))
    assert rig.ledger.entries("delete_all") == []
    (pending,) = rig.client.list_approvals(sid)  # still pending, for the same arguments
    assert pending["call_id"] == before["approvals"][0]["call_id"]
    rig.client.approve(
        sid, pending["call_id"], by="alice", arguments_hash=pending["arguments_hash"]
    )
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert len(rig.ledger.entries("delete_all")) == 1
    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert call["approval"]["approved"] is True and call["approval"]["by"] == "alice"
    assert steps(t) == [
        ("RunModel", ONE),
        ("AwaitToolApproval", []),
        ("CallSingleAttemptTool", ONE),
        ("RunModel", ONE),
    ]
    assert results(t) == [
        {"name": "delete_all", "status": "succeeded", "result": "deleted", "error": None}
    ]


@columns("await_question_answer.waiting", takeover=True, typescript=True, go=True)
def test_question_wait_survives_and_a_later_answer_resumes_the_turn(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("order", {"item": "shirt"}))
    wait_until(lambda: waits(rig, sid), 10, what="the question waits")
    before = rig.client.get_agent_snapshot(sid)

    interrupt_and_reconnect(rig, column, worker)
    assert_nothing_ran_again(before, rig.client.get_agent_snapshot(sid))
    (wait,) = waits(rig, sid)
    assert wait["type"] == "AwaitQuestionAnswer"
    assert wait["question"] == "Which size of shirt?" and wait["choices"] == ["S", "M", "L"]
    assert len(rig.ledger.entries("order.before_ask")) == 1
    rig.client.answer(sid, wait["call_id"], "M", by="carol")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    # the code before ctx.ask ran twice: once to ask, once to resume with the answer
    assert [e["answers"] for e in rig.ledger.entries("order.before_ask")] == [0, 1]
    (ordered,) = rig.ledger.entries("order")
    assert ordered["size"] == "M"
    (call,) = t["tool_calls"]
    assert call["answers"] == ["M"] and len(call["questions"]) == 1  # asked once
    assert steps(t) == [
        ("RunModel", ONE),
        ("CallTool", ONE),
        ("AwaitQuestionAnswer", []),
        ("CallTool", ONE),
        ("RunModel", ONE),
    ]
    (question,) = [s for s in t["steps"] if s["type"] == "AwaitQuestionAnswer"]
    assert question["wait"]["resolution"]["answer"] == "M"
    assert question["wait"]["resolution"]["by"] == "carol"
    assert results(t) == [
        {"name": "order", "status": "succeeded", "result": "ordered shirt in M", "error": None}
    ]


def assert_timer_fired_once(t: dict[str, Any], rig: Rig) -> dict[str, Any]:
    assert t["status"] == "completed"
    assert len(rig.ledger.entries("remind")) == 1
    assert [e["sleeps_done"] for e in rig.ledger.entries("remind.before_sleep")] == [0, 1]
    assert steps(t) == [
        ("RunModel", ONE),
        ("CallTool", ONE),
        ("AwaitTimer", []),
        ("CallTool", ONE),
        ("RunModel", ONE),
    ]
    (call,) = t["tool_calls"]
    assert call["sleeps_done"] == 1
    assert results(t) == [
        {"name": "remind", "status": "succeeded", "result": "time is up", "error": None}
    ]
    (timer,) = [s for s in t["steps"] if s["type"] == "AwaitTimer"]
    assert timer["wait"]["resolution"]["kind"] == "timer"
    assert timer["wait"]["resolved_at"] >= timer["wait"]["deadline"]
    return dict(timer["wait"])


@columns("await_timer.waiting", takeover=True, typescript=True, go=True)
def test_timer_wait_survives_and_the_timer_fires_once(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    # long enough to outlast the interruption (a restart takes about a second)
    turn = rig.call(sid, ("remind", {"seconds": 4.0}))
    wait_until(lambda: waits(rig, sid), 10, what="the timer waits")
    before = rig.client.get_agent_snapshot(sid)

    interrupt(rig, column, worker)
    assert_nothing_ran_again(before, rig.client.get_agent_snapshot(sid))  # still waiting
    t = rig.wait_turn(sid, turn)

    assert_timer_fired_once(t, rig)


@pytest.mark.crash("await_timer.waiting", SERVER_RESTART)
def test_timer_that_came_due_while_the_server_was_down_fires_once_when_it_is_back(
    rig: Rig,
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("remind", {"seconds": 1.0}))
    (wait,) = wait_until(lambda: waits(rig, sid), 10, what="the timer waits")

    rig.server.kill()
    assert time.time() < wait["deadline"], "the server went down only after the timer was due"
    wait_until(
        lambda: time.time() > wait["deadline"] + 0.2, 5, what="the timer came due, server down"
    )
    back_at = time.time()
    rig.server.start()
    t = rig.wait_turn(sid, turn)

    fired = assert_timer_fired_once(t, rig)
    assert fired["deadline"] == wait["deadline"]
    assert fired["resolved_at"] >= back_at  # it fired once the server was back


@pytest.mark.parametrize(
    "column", [pytest.param(TAKEOVER, marks=pytest.mark.crash("await_timer.waiting", TAKEOVER))]
)
def test_timer_that_came_due_while_no_node_served_fires_once_on_the_new_leader(
    rig: Rig, column: str
) -> None:
    """The node that owns the session dies while the others are paused (SIGSTOP) past the
    timer's deadline: nobody serves when it comes due. The others, resumed, take its
    partitions over, and the one that took the session's fires it once."""
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("remind", {"seconds": 1.0}))
    (wait,) = wait_until(lambda: waits(rig, sid), 10, what="the timer waits")

    others = [node for node in rig.nodes if node is not rig.server]
    for node in others:
        os.kill(node.pid, signal.SIGSTOP)
    rig.server.kill()
    assert time.time() < wait["deadline"], "the owner died only after the timer was due"
    wait_until(lambda: time.time() > wait["deadline"] + 0.2, 5, what="due, nobody serving")
    back_at = time.time()
    for node in others:
        os.kill(node.pid, signal.SIGCONT)
    rig.recover_server()  # the others take the dead node's partitions over
    t = rig.wait_turn(sid, turn)

    fired = assert_timer_fired_once(t, rig)
    assert fired["deadline"] == wait["deadline"]
    assert fired["resolved_at"] >= back_at  # it fired once the new leader served


# --- the handler that moves the turn on after a wait ended ---------------------------------


def resolve(rig: Rig, sid: str, wait: str) -> int:
    """Start a turn whose tool waits, and resolve the wait (an approval and an answer are
    acknowledged to the caller; a timer fires by itself). Returns the turn."""
    if wait == "approval":
        turn = rig.call(sid, ("publish", {"post": "hello"}))
        (pending,) = wait_until(
            lambda: rig.client.list_approvals(sid), 10, what="an approval is pending"
        )
        ack = rig.client.approve(
            sid, pending["call_id"], by="alice", arguments_hash=pending["arguments_hash"]
        )
        assert ack == {"call_id": pending["call_id"], "approved": True}
        return turn
    if wait == "answer":
        turn = rig.call(sid, ("order", {"item": "hat"}))
        (question,) = wait_until(lambda: waits(rig, sid), 10, what="the question waits")
        ack = rig.client.answer(sid, question["call_id"], "L", by="carol")
        assert ack == {"call_id": question["call_id"], "answered": True}
        return turn
    return rig.call(sid, ("remind", {"seconds": 0.2}))


WAIT_STEPS = {
    "approval": "AwaitToolApproval",
    "answer": "AwaitQuestionAnswer",
    "timer": "AwaitTimer",
}


AFTER_THE_WAIT = {"approval": "publish", "answer": "order", "timer": "remind"}
"""What each wait's tool records only once the turn moved on past the wait."""


@pytest.mark.parametrize("wait", ["approval", "answer", "timer"])
@columns("wait_handler.running", worker_kill=False, takeover=True, typescript=True, go=True)
def test_wait_handler_interrupted_runs_again_and_the_resolution_stays_recorded(
    rig: Rig, column: str, wait: str
) -> None:
    # The handler runs in the server node, so the node is what dies: it SIGKILLs itself
    # inside the handler, after the resolution's commit, before the turn moved on. (A
    # Worker killed meanwhile would interrupt nothing of this row: no Worker cell.)
    rig.start_server(failpoints="server.handler_running=crash")
    rig.start_worker()
    sid = rig.session("waiter")
    turn = resolve(rig, sid, wait)
    rig.wait_failpoint("server.handler_running")
    interrupted_at = time.time()
    wait_until(lambda: not rig.server.alive, 10, what="the server died in the handler")
    assert rig.ledger.entries(AFTER_THE_WAIT[wait]) == []  # the turn had not moved on

    rig.recover_server()
    # the handler ran again on start, before the node was ready: the wait has ended
    assert waits(rig, sid) == []
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    (waited,) = [s for s in t["steps"] if s["type"] == WAIT_STEPS[wait]]  # resolved once
    resolution = waited["wait"]["resolution"]
    # the one recorded before the crash: a node that recorded it again would have done so
    # after its restart or takeover (a takeover's first Step came 64-450 ms after this
    # moment in 27 runs), later than the nodes' clock error
    assert resolution["recorded_at"] < interrupted_at + rig.clock_error
    (tool_step,) = [s for s in t["steps"][2:] if s["type"] == "CallTool"]
    tool_attempts = [(a["number"], a["outcome"]) for a in tool_step["attempts"]]
    assert tool_attempts == ONE, tool_step["attempts"]
    # the turn moved on once: the tool ran (on from the wait) once, by its own ledger
    if wait == "approval":
        assert call["approval"]["approved"] is True and call["approval"]["by"] == "alice"
        assert call["approval"]["recorded_at"] == resolution["recorded_at"]
        assert [e["attempt"] for e in rig.ledger.entries("publish")] == [1]
    elif wait == "answer":
        assert resolution["answer"] == "L" and resolution["by"] == "carol"
        assert call["answers"] == ["L"]
        assert [e["answers"] for e in rig.ledger.entries("order.before_ask")] == [0, 1]
        assert [e["size"] for e in rig.ledger.entries("order")] == ["L"]
    else:
        assert resolution["kind"] == "timer"
        assert call["sleeps_done"] == 1  # the timer fired once
        assert [e["sleeps_done"] for e in rig.ledger.entries("remind.before_sleep")] == [0, 1]
        assert len(rig.ledger.entries("remind")) == 1
    assert results(t)[0]["status"] == "succeeded"


# --- an idle session -------------------------------------------------------------------------


@columns("idle.waiting_for_message", takeover=True, typescript=True, go=True)
def test_idle_session_interrupted_runs_nothing_and_the_next_message_starts_a_turn(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    first = rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "a"})))
    before = rig.client.get_agent_snapshot(sid)
    assert before["session"]["status"] == "idle"

    interrupt_and_reconnect(rig, column, worker)
    after = rig.client.get_agent_snapshot(sid)
    assert after["session"] == before["session"]
    assert after["current_turn"] is None and after["running"] == [] and after["waiting"] == []
    assert after["history"] == before["history"]
    assert rig.client.wait_turn(sid, 1) == first
    second = rig.wait_turn(sid, rig.client.send_message(sid, "and now?")["turn"])

    assert second["status"] == "completed" and second["text"] == "echo: and now?"
    assert attempts(second, "RunModel") == [ONE]
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert history[: len(before["history"])] == before["history"]  # intact
    assert [(i["type"], i.get("text")) for i in history[len(before["history"]) :]] == [
        ("user", "and now?"),
        ("assistant", "echo: and now?"),
    ]
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]  # ran once, in turn 1
    assert first["status"] == "completed" and results(first)[0]["status"] == "succeeded"

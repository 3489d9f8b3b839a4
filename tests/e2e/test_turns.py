"""End to end with real processes: a server node, Worker processes, the Python client."""

from __future__ import annotations

import pytest

import dex
from dex.testing import wait_until
from tests.support.rig import Rig, attempts, results


def test_a_message_during_a_turn_starts_the_next_turn(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    first = rig.call(sid, ("lookup", {"key": "a", "gate": "g"}))
    rig.wait_entered("g", 1)
    second = rig.client.send_message(sid, "and then?")
    assert (first, second["turn"], second["status"]) == (1, 2, "running")
    assert rig.client.get_agent_snapshot(sid)["session"]["queued_messages"][0]["number"] == 2

    rig.open_gate("g")
    assert results(rig.wait_turn(sid, first))[0]["status"] == "succeeded"
    assert rig.wait_turn(sid, 2)["text"] == "echo: and then?"
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history] == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "user",
        "assistant",
    ]


def test_sending_the_same_message_id_twice_starts_one_turn(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    a = rig.client.send_message(sid, "once", message_id="m-1", wait=True)
    b = rig.client.send_message(sid, "once", message_id="m-1", wait=True)
    assert (a["turn"], a["created"], b["turn"], b["created"]) == (1, True, 1, False)
    assert b["text"] == "echo: once"
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history] == ["user", "assistant"]


def test_a_failing_tool_attempt_is_retried_then_a_read_records_failed(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    t = rig.wait_turn(sid, rig.call(sid, ("flaky", {})))
    assert [e["attempt"] for e in rig.ledger.entries("flaky")] == [1, 2]  # its policy: 2
    assert attempts(t, "CallTool") == [[(1, "failed"), (2, "failed")]]
    (seen,) = results(t)
    assert seen["status"] == "failed"
    assert "flaky failure on attempt 2" in seen["error"]


def test_when_the_model_fails_for_good_a_note_names_the_tools_that_ran(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("fragile")
    t = rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "n"}), ("nosuch", {})))
    assert t["status"] == "failed"
    assert attempts(t, "RunModel") == [
        [(1, "succeeded")],
        [(1, "failed"), (2, "failed"), (3, "failed")],
    ]
    note = rig.client.get_agent_snapshot(sid)["history"][-1]
    assert note["type"] == "note"
    assert "lookup" in note["text"] and "do not repeat them" in note["text"]
    assert "nosuch" not in note["text"]  # an unknown tool never ran
    # the next message starts a new turn, whose model sees the note
    after = rig.wait_turn(sid, rig.client.send_message(sid, "hi")["turn"])
    assert after["status"] == "completed"
    assert after["text"].startswith("I see a note: ")
    assert "lookup" in after["text"]


def test_worker_sigterm_finishes_running_work_then_exits(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "d", "gate": "g"}))
    rig.wait_entered("g", 1)
    assert worker.proc is not None
    worker.proc.terminate()  # SIGTERM: drain
    wait_until(lambda: "draining" in worker.output(), 10, what="the Worker drains")
    assert rig.client.get_agent_snapshot(sid)["running"]  # it still holds the attempt
    rig.open_gate("g")
    assert worker.proc.wait(20) == 0

    snap = rig.client.get_agent_snapshot(sid)
    calls = snap["current_turn"]["tool_calls"]
    assert calls[0]["status"] == "succeeded"  # finished within the drain timeout
    # the next RunModel waits for a Worker: the draining one took nothing new
    wait_until(lambda: rig.client.get_agent_snapshot(sid)["waiting"], 10, what="RunModel queued")
    rig.start_worker()
    t = rig.wait_turn(sid, turn)
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]


def test_unknown_session_and_agent_are_clear_errors(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session()
    with pytest.raises(dex.NotFound, match="unknown session"):
        rig.client.send_message("s_missing", "hi")
    with pytest.raises(dex.NotFound, match="unknown agent"):
        rig.client.create_session("nobody")
    with pytest.raises(dex.InvalidInput):
        rig.client.create_session("assistant", session_id="has spaces")

"""The fleet view and the inbox with real processes: a send that waits returns as soon as
the turn waits for a person, and what waits survives a server's SIGKILL."""

from __future__ import annotations

import json
import time

from tests.support.rig import Rig


def ask_for(*calls: tuple[str, dict[str, object]]) -> str:
    return "call: " + json.dumps([list(c) for c in calls])


def test_a_waiting_send_returns_at_the_approval_and_the_inbox_survives_a_restart(
    rig: Rig,
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    asker = rig.session("waiter")

    start = time.monotonic()
    turn = rig.client.send_message(sid, ask_for(("delete_all", {})), wait=True, timeout=60)
    took = time.monotonic() - start

    assert turn["status"] == "waiting" and took < 30
    (wait,) = turn["waiting_for"]
    assert (wait["kind"], wait["tool"], wait["arguments"]) == ("approval", "delete_all", {})
    asked = rig.client.send_message(
        asker, ask_for(("order", {"item": "shirt"})), wait=True, timeout=60
    )
    assert asked["status"] == "waiting"
    assert asked["waiting_for"][0]["question"] == "Which size of shirt?"
    assert rig.ledger.entries("delete_all") == []

    rig.restart_server()  # SIGKILL: what waits is durable

    inbox = rig.client.list_inbox()["items"]
    assert [(i["session_id"], i["kind"]) for i in inbox] == [
        (asker, "question"),
        (sid, "approval"),
    ]
    waiting = rig.client.list_sessions(status="waiting")["sessions"]
    assert {s["id"] for s in waiting} == {sid, asker}
    assert rig.client.wait_turn(sid, turn["turn"], timeout=60)["status"] == "waiting"

    rig.client.approve(sid, wait["call_id"], by="ops")
    done = rig.wait_turn(sid, turn["turn"])
    assert done["status"] == "completed"
    assert len(rig.ledger.entries("delete_all")) == 1
    assert [i["session_id"] for i in rig.client.list_inbox()["items"]] == [asker]
    assert rig.client.list_sessions(status="idle")["sessions"][0]["id"] == sid

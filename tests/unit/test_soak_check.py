"""The soak's invariant checker finds each kind of violation on made-up evidence, and
none on evidence where every promise held."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from bench.soak_check import Evidence, Send, check

from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX

S = "sess-1"


def run(effect: str, tag: str, call: str, key: str, **fields: Any) -> dict[str, Any]:
    return {
        "effect": effect,
        "tag": tag,
        "key": key,
        "session": S,
        "call": call,
        "at": 10.0,
        "attempt": 1,
        **fields,
    }


def call(id_: str, name: str, tag: str, status: str, error: str | None = None) -> dict[str, Any]:
    return {
        "turn": 1,
        "id": id_,
        "name": name,
        "arguments": {"tag": tag, "ms": 0},
        "idempotency_key": f"{S}/{id_}",
        "status": status,
        "error": error,
    }


def good() -> Evidence:
    """One turn with a charge, an upsert, a transfer (denied), a render and a nap; every
    promise kept."""
    text = "m1 call: [...]"
    calls = [
        call("c0", "charge", "t0", "succeeded"),
        call("c1", "upsert", "t1", "succeeded"),
        call("c2", "transfer", "t2", "denied"),
        call("c3", "render", "t3", "succeeded"),
        call("c4", "nap", "t4", "succeeded"),
    ]
    ledger = [
        run("charge", "t0", "c0", f"{S}/c0"),
        run("charge.done", "t0", "c0", f"{S}/c0"),
        run("upsert", "t1", "c1", f"{S}/c1"),
        run("upsert", "t1", "c1", f"{S}/c1", attempt=2),
        run("upsert.done", "t1", "c1", f"{S}/c1", attempt=2),
        run("render.start", "t3", "c3", f"{S}/c3"),
        run("render.poll", "", "c3", f"{S}/c3", handle_key=f"{S}/c3"),
        run("nap", "t4", "c4", f"{S}/c4", sleeps_done=0),
        run("nap.fired", "t4", "c4", f"{S}/c4", sleeps_done=1, at=12.0),
    ]
    timer = {
        "id": "st",
        "type": "AwaitTimer",
        "tool_call_id": "c4",
        "status": "succeeded",
        "attempts": [],
        "wait": {"deadline": 11.5, "resolved_at": 11.6},
    }
    snapshot = {
        "session": {"status": "idle", "queued_messages": []},
        "current_turn": None,
        "running": [],
        "waits": [],
        "history": [{"type": "user", "text": text}, {"type": "assistant", "text": "x"}],
        "tool_calls": calls,
    }
    turn = {"status": "completed", "steps": [timer], "tool_calls": calls}
    return Evidence(
        sends=[Send(S, "m1", text, {c["arguments"]["tag"]: c["name"] for c in calls}, turn=1)],
        snapshots={S: snapshot},
        turns={(S, 1): turn},
        ledger=ledger,
        decisions={"t2": "deny"},
    )


def kinds(evidence: Evidence) -> set[str]:
    return {v.kind for v in check(evidence).violations}


def test_no_violation_when_every_promise_held() -> None:
    findings = check(good())
    assert findings.violations == []
    assert findings.calls[("charge", "succeeded")] == 1
    assert findings.turns["completed"] == 1
    assert not findings.window


@pytest.mark.parametrize(
    ("why", "cause"),
    [
        ("the node restarted", "node_restart"),  # as the node's recovery says (ha.node)
        ("its partition was taken over by another node", "node_restart"),
        ("its result from Worker w-1 was refused: the disk is full", "result_refused"),
        (
            "the node restarted or took the session over, and Worker w-1 did not reclaim "
            "the attempt within 3s",
            "not_reclaimed",
        ),
    ],
)
def test_a_write_that_completed_after_outcome_unknown_is_the_window_not_a_violation(
    why: str, cause: str
) -> None:
    e = good()
    c = e.snapshots[S]["tool_calls"][0]
    c["status"] = "outcome_unknown"
    c["error"] = f"the outcome is unknown: the tool may have run ({why})"
    findings = check(e)
    assert findings.violations == []
    assert findings.window == findings.unknown == {cause: 1}


def mutate_write_twice(e: Evidence) -> None:
    e.ledger.append(run("charge", "t0", "c0", f"{S}/c0", attempt=2))


def mutate_key(e: Evidence) -> None:
    e.ledger[3]["key"] = "another-key"


def mutate_foreign(e: Evidence) -> None:
    e.ledger.append(run("lookup", "t99", "c99", f"{S}/c99"))


def mutate_succeeded_without_run(e: Evidence) -> None:
    e.ledger = [r for r in e.ledger if r["effect"] != "upsert.done"]


def mutate_not_run_but_ran(e: Evidence) -> None:
    c = e.snapshots[S]["tool_calls"][1]
    c["status"], c["error"] = "failed", TOOL_CALL_NOT_RUN_ERROR_PREFIX + ": cancelled"


def mutate_denied_but_ran(e: Evidence) -> None:
    e.ledger.append(run("transfer", "t2", "c2", f"{S}/c2"))


def mutate_approval_ignored(e: Evidence) -> None:
    e.decisions["t2"] = "approve"


def mutate_timer_twice(e: Evidence) -> None:
    e.turns[(S, 1)]["steps"].append(copy.deepcopy(e.turns[(S, 1)]["steps"][0]))


def mutate_timer_early(e: Evidence) -> None:
    e.ledger[-1]["at"] = 11.0


def mutate_timer_never_fired(e: Evidence) -> None:
    e.turns[(S, 1)]["steps"][0]["wait"]["resolved_at"] = None


def mutate_message_missing(e: Evidence) -> None:
    e.snapshots[S]["history"] = e.snapshots[S]["history"][1:]


def mutate_message_twice(e: Evidence) -> None:
    e.snapshots[S]["history"].append({"type": "user", "text": e.sends[0].text})


def mutate_message_unsent(e: Evidence) -> None:
    e.snapshots[S]["history"].append({"type": "user", "text": "nobody sent this"})


def mutate_running_unheld(e: Evidence) -> None:
    e.snapshots[S]["current_turn"] = {
        "number": 2,
        "steps": [
            {"id": "st9", "type": "CallTool", "status": "running", "attempts": [{"number": 1}]}
        ],
    }


def mutate_unheld_during_chaos(e: Evidence) -> None:
    e.unheld = {f"{S}/st9/1 (CallTool)": S}


def mutate_ended_turn_with_running_step(e: Evidence) -> None:
    e.turns[(S, 1)]["steps"].append({"id": "st8", "type": "RunModel", "status": "running"})


def mutate_client_error(e: Evidence) -> None:
    e.client_errors = [
        "snapshot of sess-1: ClientPayloadError('Response payload is not completed')"
    ]


def mutate_stuck(e: Evidence) -> None:
    e.turns[(S, 1)]["status"] = "running"


def mutate_session_busy(e: Evidence) -> None:
    e.snapshots[S]["session"]["status"] = "running"


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (mutate_write_twice, "write_ran_twice"),
        (mutate_key, "key_changed"),
        (mutate_foreign, "foreign_run"),
        (mutate_succeeded_without_run, "succeeded_without_run"),
        (mutate_not_run_but_ran, "not_run_but_ran"),
        (mutate_denied_but_ran, "denied_but_ran"),
        (mutate_approval_ignored, "approval_ignored"),
        (mutate_timer_twice, "timer_not_once"),
        (mutate_timer_early, "timer_not_once"),
        (mutate_timer_never_fired, "timer_not_once"),
        (mutate_message_missing, "message_not_once"),
        (mutate_message_twice, "message_not_once"),
        (mutate_message_unsent, "message_not_once"),
        (mutate_running_unheld, "step_running_unheld"),
        (mutate_unheld_during_chaos, "step_running_unheld"),
        (mutate_ended_turn_with_running_step, "step_running_unheld"),
        (mutate_client_error, "client_error"),
        (mutate_stuck, "stuck"),
        (mutate_session_busy, "stuck"),
    ],
)
def test_each_broken_promise_is_a_violation(mutate: Any, kind: str) -> None:
    e = good()
    mutate(e)
    assert kind in kinds(e)

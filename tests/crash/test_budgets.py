"""Budgets across crashes: a turn that waits for its budget lives in Dex Server, so a
crash runs nothing again and a later raise resumes the turn once; a model call's usage
counts once, when its result commits, also when the node dies between the model's answer
and the commit (the Worker that lives on reclaims the attempt and sends the result
again)."""

from __future__ import annotations

from typing import Any

import pytest

from dex.testing import wait_until
from tests.crash.helpers import WORKER_KILL, columns, interrupt_and_reconnect
from tests.support.agents import SPENT
from tests.support.rig import Rig, attempts, metric, model_calls, results

CALL = SPENT.input_tokens + SPENT.output_tokens
"""The tokens each model call of the ``spender`` agent uses (1,100)."""


def usage(rig: Rig, sid: str) -> dict[str, Any]:
    found: dict[str, Any] = rig.client.get_agent_snapshot(sid)["session"]["usage"]
    return found


def budget_wait(rig: Rig, sid: str, turn: int) -> list[dict[str, Any]]:
    record = rig.client.wait_turn(sid, turn, timeout=0)
    waits: list[dict[str, Any]] = record.get("waiting_for", [])
    return [w for w in waits if w["kind"] == "budget"]


STEPS = {
    "session": ["RunModel", "CallTool", "AwaitBudget", "RunModel"],
    "tenant": ["AwaitBudget", "RunModel", "CallTool", "RunModel"],  # its first call waited
}


@columns("await_budget.waiting", takeover=True)
@pytest.mark.parametrize("whose", ["session", "tenant"])
def test_a_turn_waiting_for_its_budget_survives_and_resumes_once_after_a_raise(
    rig: Rig, column: str, whose: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    rig.session("spender")  # the agent is registered
    if whose == "session":
        sid = rig.client.create_session("spender", budget={"max_tokens": 1_000})["id"]
        reason = f"{CALL} tokens used of a budget of 1000"
    else:  # the tenant's day: another session of the tenant used it up
        rig.client.set_tenant_budget("acme", max_tokens_per_day=1_000)
        spent = rig.client.create_session("spender", tenant="acme")["id"]
        rig.sessions.append(spent)
        rig.wait_turn(spent, rig.client.send_message(spent, "hi")["turn"])
        sid = rig.client.create_session("spender", tenant="acme")["id"]
        reason = f"tenant acme: {CALL} tokens used today of 1000"
    rig.sessions.append(sid)
    turn = rig.call(sid, ("lookup", {"key": "k"}))
    wait_until(lambda: budget_wait(rig, sid, turn), 20, what="the turn waits for its budget")
    before = rig.client.get_agent_snapshot(sid)
    calls = model_calls(rig, sid)
    assert calls == ([1] if whose == "session" else [])  # the tenant's: none yet

    interrupt_and_reconnect(rig, column, worker)
    after = rig.client.get_agent_snapshot(sid)
    assert after["waits"] == before["waits"]  # the same wait, nothing ran again
    assert after["current_turn"]["steps"] == before["current_turn"]["steps"]
    assert after["running"] == [] and after["waiting"] == []
    assert after["session"]["usage"] == before["session"]["usage"]
    [wait] = budget_wait(rig, sid, turn)
    assert wait["reason"] == reason
    assert model_calls(rig, sid) == calls

    if whose == "session":
        rig.client.set_budget(sid, max_tokens=10_000, by="ops")
        rig.client.set_budget(sid, max_tokens=20_000)  # nothing waits any more: no second call
    else:
        rig.client.set_tenant_budget("acme", max_tokens_per_day=10_000, by="ops")
        rig.client.set_tenant_budget("acme", max_tokens_per_day=20_000, by="ops")
        # in a cluster, the node that serves the session learns of it within seconds
        wait_until(lambda: not budget_wait(rig, sid, turn), 10, what="the wait ended")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert model_calls(rig, sid) == [1, 1]  # the model's own count: each call ran once
    assert [e["attempt"] for e in rig.ledger.entries("lookup")] == [1]
    assert [s["type"] for s in t["steps"]] == STEPS[whose]
    [wait_step] = [s for s in t["steps"] if s["type"] == "AwaitBudget"]
    assert wait_step["wait"]["resolution"]["by"] == "ops"
    [looked_up] = results(t)
    assert looked_up["status"] == "succeeded" and looked_up["result"] == {"key": "k", "value": "K"}
    assert usage(rig, sid)["input_tokens"] == 2 * SPENT.input_tokens
    if whose == "tenant":  # the tenant's count: its two sessions' calls, each once
        assert rig.client.get_tenant("acme")["today"]["calls"] == 3


@columns("model_usage.result_sent", reclaim=True)
def test_a_model_call_s_usage_counts_once_when_a_crash_comes_before_its_commit(
    rig: Rig, column: str
) -> None:
    if column == WORKER_KILL:
        # the Worker dies right after sending the model's answer: Dex commits it, or fails
        # the attempt and the call runs again (a new call, counted when it commits)
        rig.start_server()
        worker = rig.start_worker(failpoints="worker.after_send_result=crash@1")
    else:
        # the node dies on receiving the first result: the model's answer, not yet committed
        rig.start_server(failpoints="server.before_commit_result=crash@1")
        rig.start_worker()
    rig.session("spender")  # the agent is registered (no result sent yet)
    sid = rig.client.create_session("spender", budget={"max_tokens": 5_000}, tenant="acme")["id"]
    rig.sessions.append(sid)
    turn = rig.client.send_message(sid, "hello")["turn"]
    if column == WORKER_KILL:
        wait_until(lambda: not worker.alive, 20, what="the Worker died at the failpoint")
        rig.start_worker()
    else:
        wait_until(lambda: not rig.server.alive, 20, what="the node died at the failpoint")
        rig.recover_server()
    t = rig.wait_turn(sid, turn)

    assert t["text"] == "echo: hello"
    [model_attempts] = attempts(t, "RunModel")
    committed = [a for a in model_attempts if a[1] == "succeeded"]
    assert len(committed) == 1  # one result committed, whatever else the model was asked
    # the model's own count agrees with the record: each attempt called it once
    assert model_calls(rig, sid) == [n for n, _ in model_attempts]
    if column != WORKER_KILL:
        # the Worker lived on, reclaimed its attempt and sent the result again: it
        # committed once, and the model was called once
        assert model_attempts == [(1, "succeeded")]
        assert metric(rig, "dex_attempts_reclaimed_total") == 1
    # counted once: the committed call's usage, never a second time for a resent result
    assert usage(rig, sid) == {
        "input_tokens": SPENT.input_tokens,
        "output_tokens": SPENT.output_tokens,
        "cost_usd": 0.0045,
    }
    [step] = t["steps"]
    assert step["usage"] == SPENT.model_dump()
    # and its tenant's day counts it once: added in the same commit as the result
    today = rig.client.get_tenant("acme")["today"]
    assert (today["calls"], today["tokens"], today["cost_usd"]) == (1, CALL, 0.0045)

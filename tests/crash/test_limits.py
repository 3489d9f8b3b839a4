"""Flow control across failures: a Step a limit holds, and a model call the provider
refused, stay queued with no attempt used, and run once, as attempt 1, once admitted."""

from __future__ import annotations

import functools
import json
import urllib.request
from typing import Any

from dex.testing import wait_until
from tests.crash.helpers import columns, interrupt
from tests.support.agents import LIMITED_GROUP, RETRY_AFTER
from tests.support.rig import Rig, attempts, model_calls


def waiting(rig: Rig, session_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = rig.client.get_agent_snapshot(session_id)["waiting"]
    return found


def limit_everywhere(rig: Rig, concurrency: int) -> None:
    """Set the group's limit, and wait until every node enforces it (a node of a cluster
    reads the stored limits every few seconds)."""
    rig.client.set_limit(LIMITED_GROUP, concurrency=concurrency)

    def enforced(address: str) -> bool:
        with urllib.request.urlopen(address + "/admin/limits", timeout=5) as response:
            groups = json.loads(response.read())["groups"]
        return any(
            g["group"] == LIMITED_GROUP and (g["limit"] or {}).get("concurrency") == concurrency
            for g in groups
        )

    for node in rig.nodes:
        wait_until(functools.partial(enforced, node.address), 10, what=f"{node.address} has it")


@columns("limits.held", takeover=True)
def test_a_step_held_by_a_limit_uses_no_attempt_and_runs_once_admitted(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    limit_everywhere(rig, concurrency=1)
    busy = rig.session("limited")
    busy_turn = rig.client.send_message(busy, "hold:busy")["turn"]
    rig.wait_entered("busy", 1)
    sid = rig.session("limited")
    turn = rig.client.send_message(sid, "hello")["turn"]
    held = {"key": LIMITED_GROUP, "limit": "concurrency", "until": None}
    wait_until(
        lambda: [w["limit"] for w in waiting(rig, sid)] == [held],
        10,
        what="its model call held by the group's limit of one call at once",
    )

    # the node and (or) the Worker die: the busy call's attempt fails and runs again;
    # the held Step is still queued with no attempt, and the stored limit still holds
    worker = interrupt(rig, column, worker)
    rig.wait_entered("busy", 2)
    current = rig.client.get_agent_snapshot(sid)["current_turn"]
    if current is not None:  # the busy call went first: this one is held again
        (step,) = current["steps"]
        assert (step["status"], step["attempts"]) == ("queued", [])
        assert [w["limit"] for w in waiting(rig, sid)] == [held]
    else:  # it went first, and ended before the busy call could start again
        assert model_calls(rig, sid, "served") == [1]
    rig.open_gate("busy")

    t = rig.wait_turn(sid, turn)
    assert t["status"] == "completed" and t["text"] == "echo: hello"
    assert attempts(t, "RunModel") == [[(1, "succeeded")]]
    assert model_calls(rig, sid, "served") == [1]  # the model's own count: it ran once
    busy_t = rig.wait_turn(busy, busy_turn)
    assert attempts(busy_t, "RunModel") == [[(1, "failed"), (2, "succeeded")]]
    assert model_calls(rig, busy, "served") == [1, 2]


@columns("run_model.rate_limited", takeover=True)
def test_a_refused_model_call_uses_no_attempt_and_waits_out_retry_after(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("limited")
    turn = rig.client.send_message(sid, "ratelimit:quota")["turn"]
    wait_until(
        lambda: (
            [w["waiting_for"] for w in waiting(rig, sid)] == ["the model provider's rate limit"]
        ),
        10,
        what="the refused call queued again until its Retry-After",
    )
    (refused,) = rig.ledger.entries("refused")
    (step,) = rig.client.get_agent_snapshot(sid)["current_turn"]["steps"]
    assert step["attempts"] == []  # the refusal used none

    worker = interrupt(rig, column, worker)
    rig.open_gate("quota")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed" and t["text"] == "echo: ratelimit:quota"
    assert attempts(t, "RunModel") == [[(1, "succeeded")]]
    # by the model's own ledger: refused once, then served once, not before Retry-After
    assert len(rig.ledger.entries("refused")) == 1
    (served,) = [e for e in rig.ledger.entries("served") if e["session_id"] == sid]
    assert served["attempt"] == 1
    assert served["at"] >= refused["at"] + RETRY_AFTER - rig.clock_error

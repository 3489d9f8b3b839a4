"""The TypeScript Client (``sdk/typescript/src/client.ts``) against a real server and a real
TypeScript Worker serving the test agents: ``sdk/typescript/test/client-e2e.ts`` (built to
``dist/test/client-e2e.js`` by ``scripts/typescript``) creates a session, sends a message
whose tool needs approval, finds the approval in the snapshot and the inbox, approves it,
waits for the turn, reads the event stream from the start and again after its first id,
denies a second call, forks the session and meets the server's refusals; then it sets and
removes a session's budget, model groups' limits and a tenant's budget. It prints a JSON
summary, checked here against the server (the Python Client) and the tool's ledger."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dex.testing import free_port
from tests.support.rig import Rig

PROGRAM = Path(__file__).parents[2] / "sdk" / "typescript" / "dist" / "test" / "client-e2e.js"


def test_the_typescript_client_drives_a_session_through_an_approval(rig: Rig) -> None:
    assert PROGRAM.exists(), "run scripts/typescript (npm run build in sdk/typescript)"
    rig.start_server()
    rig.start_worker(language="typescript")
    # a dead address first: the Client moves on to the node that serves
    dead = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        ["node", str(PROGRAM)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DEX_ADDRESS": f"{dead},{rig.address}", "DEX_CLIENT_TOKEN": ""},
    )
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    sid = s["session"]["id"]
    assert s["addresses"] == 2
    assert "waiter" in s["agents"]
    assert s["session"] == {"id": "ts-client-1", "agent": "waiter", "status": "idle"}

    # the send waited until the turn waited for a person, and said for what
    ended = rig.client.wait_turn(sid, 1)
    (call,) = ended["tool_calls"]
    expected_wait = {
        "call_id": call["id"],
        "kind": "approval",
        "tool": "publish",
        "arguments": {"post": "hello"},
        "arguments_hash": call["arguments_hash"],
    }
    assert s["sent"] == {
        "turn": 1,
        "status": "waiting",
        "created": True,
        "waiting_for": [expected_wait],
    }
    assert s["resent"] == {"turn": 1, "created": False}  # the same message id: the same turn
    assert s["snapshot"] == {"status": "waiting", "approvals": [call["id"]], "current_turn": 1}
    assert s["approvals"] == [
        {"call_id": call["id"], "tool": "publish", "arguments": {"post": "hello"}}
    ]
    assert {"session_id": sid, "call_id": call["id"], "kind": "approval", "tool": "publish"} in s[
        "inbox"
    ]
    assert s["waiting_sessions"] == [sid]

    # approved once (a second approval is refused), then the turn ran the tool once
    assert s["approved"] == {"call_id": call["id"], "approved": True}
    assert (s["approved_twice"]["status"], s["approved_twice"]["code"]) == (409, "conflict")
    assert s["turn"]["status"] == "completed"
    assert s["turn"]["text"] == ended["text"]
    assert s["turn"]["tool_calls"] == [
        {
            "id": call["id"],
            "name": "publish",
            "status": "succeeded",
            "idempotency_key": call["idempotency_key"],
        }
    ]
    (effect,) = rig.ledger.entries("publish")  # the denied call never ran
    assert effect == {
        "effect": "publish",
        "post": "hello",
        "attempt": 1,
        "idempotency_key": call["idempotency_key"],
    }

    # the stream from the start: the turn's events in order, up to its end
    types = [e["type"] for e in s["events"]]
    assert types[0] == "history.item" and types[-1] == "turn.completed"
    assert types.index("turn.started") < types.index("wait.started") < len(types) - 1
    ids = [e["id"] for e in s["events"]]
    assert all(ids) and len(set(ids)) == len(ids)
    assert s["resumed"] == s["events"][1]  # Last-Event-ID: the event after the first

    assert s["denied"] == {"call_id": "2.1", "approved": False}
    second = rig.client.wait_turn(sid, 2)
    assert second["tool_calls"][0]["status"] == "denied"
    assert s["second_turn"] == {"turn": 2, "status": "completed", "text": second["text"]}
    assert s["forked"] == {"id": f"{sid}-fork", "forked_from": {"session_id": sid, "turn": 3}}
    assert s["idle_pages"] == [[f"{sid}-fork"], [sid]]  # newest first, one a page, by cursor

    assert (s["cancel_idle"]["status"], s["cancel_idle"]["code"]) == (409, "conflict")
    assert s["unknown_session"] == {
        "status": 404,
        "code": "not_found",
        "message": "unknown session 'no-such-session'",
    }
    assert s["workers"] == 1
    assert s["cluster_members"] == 0

    # flow control: a session created with a tenant, a priority and a budget
    b = s["budgeted"]
    assert (b["id"], b["tenant"]) == ("ts-client-budget", "acme")
    assert b["set"] == {
        "session_id": "ts-client-budget",
        "budget": {"max_tokens": None, "max_cost_usd": 2.5},
        "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        "status": "idle",
    }
    assert b["refused"] == 422  # a budget of neither limit
    assert b["removed"] == {**b["set"], "budget": None}
    assert b["unknown"] == 404
    budgeted = rig.client.get_agent_snapshot("ts-client-budget")["session"]
    assert (budgeted["tenant"], budgeted["priority"], budgeted["budget"]) == ("acme", 3, None)

    # model limits: a group's slashes and odd characters reach the server as they are
    limits = s["limits"]
    assert limits["set"] == {
        "group": "anthropic/claude-sonnet-4-5",
        "limit": {"concurrency": 2, "rpm": 60.0, "tpm": None},
        "source": "api",
        "running": 0,
        "waiting": 0,
        "lowered_to": 1.0,
    }
    assert limits["odd"]["limit"] == {"concurrency": None, "rpm": None, "tpm": 1000.0}
    assert limits["refused"] == 422
    assert "anthropic/claude-sonnet-4-5" not in limits["cleared"]
    (odd,) = [g for g in rig.client.get_limits() if g["group"] == "team #1/a?b%c d"]
    assert (odd["source"], odd["limit"]["tpm"]) == ("api", 1000.0)

    # the tenant's budget: set, the same read back three ways, refused when bad, removed
    t = s["tenant"]
    zero = {"input_tokens": 0, "output_tokens": 0, "tokens": 0, "cost_usd": 0, "calls": 0}
    assert t["set"] == {
        "tenant": "acme",
        "budget": {
            "max_tokens_per_day": 100_000,
            "max_cost_usd_per_day": None,
            "max_tokens_per_month": None,
            "max_cost_usd_per_month": 50.0,
        },
        "day": t["set"]["day"],
        "today": zero,
        "this_month": zero,
        "reached": None,
    }
    assert t["read"] == t["listed"] == t["in_snapshot"] == t["set"]
    # none of the four limits, a limit of 0, a name that is no tenant's
    assert t["refused"] == [422, 422, 422]
    assert t["after_refusals"] == t["set"]["budget"]  # a refused budget changed nothing
    assert t["removed"] == {**t["set"], "budget": None}
    acme = rig.client.get_tenant("acme")
    assert (acme["budget"], acme["day"]) == (None, t["set"]["day"])

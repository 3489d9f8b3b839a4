"""The Go Client (``sdk/go/client``) against a real ``dex server`` and the Go Worker of
the test agents: ``sdk/go/internal/testclient``, built here, creates a session, sends a
message whose tool (``publish``) needs approval, finds the approval in the turn, the
snapshot, the inbox and the approvals, approves it, waits for the turn, reads the event
stream from the start and resumes it, forks and denies; then sets and removes a session's
budget, model groups' limits and a tenant's budget, and prints what it saw; this test
checks that summary and the tool's ledger. The client is given a dead address first: it
moves on to the node that serves."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dex.testing import free_port
from tests.support.rig import Rig

SDK = Path(__file__).parents[2] / "sdk" / "go"


def build(out: Path) -> Path:
    """The test client, built as scripts/go builds the test Worker: offline, from
    Debian's modules."""
    binary = out / "dex-test-client"
    env = {
        **os.environ,
        "GOPROXY": "off",
        "GOFLAGS": "-mod=mod",
        "GOTOOLCHAIN": "local",
        "GOCACHE": os.environ.get("GOCACHE", "/tmp/dex-go-cache"),
        "GOPATH": os.environ.get("GOPATH", "/tmp/dex-go-path"),
    }
    subprocess.run(
        ["go", "build", "-o", str(binary), "./internal/testclient"],
        cwd=SDK,
        env=env,
        check=True,
        timeout=120,
    )
    return binary


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, worker_language="go")
    try:
        yield r
    finally:
        r.close()


def test_the_go_client_drives_an_approval_end_to_end(rig: Rig, tmp_path: Path) -> None:
    client = build(tmp_path)
    rig.start_server()
    rig.start_worker()
    dead = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(
        [client, "-addresses", f"{dead},{rig.address}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)

    assert summary["addresses"] == [dead, rig.address]
    assert summary["session"] == {"id": "go-client-1", "agent": "waiter", "status": "idle"}
    assert summary["create_again"] == "409 conflict"
    # the send returned as soon as the turn waited for the approval
    assert summary["sent"] == {
        "turn": 1,
        "status": "waiting",
        "created": True,
        "waiting_for": {"kind": "approval", "tool": "publish", "arguments": {"post": "hello"}},
    }
    call_id = summary["inbox"]["call_id"]
    assert summary["snapshot_waiting"] == {
        "status": "waiting",
        "approvals": [call_id],
        "steps": ["RunModel succeeded 1", "AwaitToolApproval waiting 0"],
        "turn_status": "running",
        "waiting_since": True,
    }
    assert summary["inbox"] == {
        "call_id": call_id,
        "kind": "approval",
        "tool": "publish",
        "turn": 1,
    }
    assert summary["approvals"] == 1
    assert summary["approved"] is True
    assert summary["approve_again"] == "409 conflict"  # the wait is resolved

    turn = summary["turn"]
    assert turn["status"] == "completed"
    assert json.loads(turn["text"].removeprefix("results: ")) == [
        {"name": "publish", "status": "succeeded", "result": "published hello", "error": None}
    ]
    call = summary["tool_call"]
    assert call["status"] == "succeeded" and call["result"] == "published hello"
    assert call["approval_by"] == "go-client"
    # the same message id again (with a wait): the first send's turn, ended, and nothing new
    assert summary["send_again"] == {"turn": 1, "created": False, "status": "completed"}

    # the tool ran once, with the key Dex gave it
    (effect,) = rig.ledger.entries("publish")
    assert effect["post"] == "hello" and effect["attempt"] == 1
    assert effect["idempotency_key"] == call["idempotency_key"]

    events = summary["events"]
    assert events[0] == "history.item"  # the user's message
    assert "turn.started" in events and "wait.started" in events
    assert events[-1] == "turn.completed"
    assert events.index("turn.started") < events.index("wait.started")
    resumed = summary["resumed_events"]
    assert resumed == events[events.index("wait.started") + 1 :]
    assert summary["resumed_ids_follow"] is True

    assert "go-client-1" in summary["listed_idle"]
    assert summary["workers"]["count"] == 1 and "waiter" in summary["workers"]["agents"]
    assert summary["cluster"] == {"members": 0, "node_id": ""}  # a node alone

    assert summary["fork"] == {
        "id": "go-client-fork",
        "from": {"session_id": "go-client-1", "turn": 2},
        "messages_received": 1,
    }
    assert summary["fork_turn"]["status"] == "completed"
    assert summary["fork_turn"]["call_status"] == "denied"
    assert "not today" in summary["fork_turn"]["call_error"]
    assert [e["post"] for e in rig.ledger.entries("publish")] == ["hello"]  # denied: never ran

    assert summary["snapshot_ended"] == {
        "status": "idle",
        "last_turn_status": "completed",
        "current_turn": False,
        "history": ["user", "assistant", "tool_result", "assistant"],
        "tool_calls": ["1 publish succeeded"],
        "approvals": 0,
    }
    assert summary["cancel_idle"] == "409 conflict"
    assert summary["unknown_session"] == "404 not_found"
    assert summary["unknown_session_events"] == "404 not_found"

    # what the Python Client reads agrees
    snapshot = rig.client.get_agent_snapshot("go-client-1")
    assert [c["status"] for c in snapshot["tool_calls"]] == ["succeeded"]
    assert snapshot["tool_calls"][0]["idempotency_key"] == call["idempotency_key"]

    # flow control: a session created with a tenant, a priority and a budget
    b = summary["budgeted"]
    assert (b["id"], b["tenant"]) == ("go-client-budget", "acme")
    assert b["created"] == {"priority": 3, "budget": {"max_tokens": 1000}}
    assert b["set"] == {
        "session_id": "go-client-budget",
        "budget": {"max_cost_usd": 2.5},  # the new budget replaces the old one whole
        "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0},
        "status": "idle",
    }
    assert b["refused"] == "422 invalid_request"  # a budget of neither limit
    assert b["removed"] == {**b["set"], "budget": None}
    assert b["unknown"] == "404 not_found"
    budgeted = rig.client.get_agent_snapshot("go-client-budget")["session"]
    assert (budgeted["tenant"], budgeted["priority"], budgeted["budget"]) == ("acme", 3, None)

    # model limits: a group's slashes and odd characters reach the server as they are
    limits = summary["limits"]
    assert limits["set"] == {
        "group": "anthropic/claude-sonnet-4-5",
        "limit": {"concurrency": 2, "rpm": 60, "tpm": None},
        "source": "api",
        "running": 0,
        "waiting": 0,
        "lowered_to": 1,
    }
    assert limits["odd"]["limit"] == {"concurrency": None, "rpm": None, "tpm": 1000}
    assert limits["refused"] == "422 invalid_request"
    assert "anthropic/claude-sonnet-4-5" not in limits["cleared"]
    (odd,) = [g for g in rig.client.get_limits() if g["group"] == "team #1/a?b%c d"]
    assert (odd["source"], odd["limit"]["tpm"]) == ("api", 1000.0)

    # the tenant's budget: set, the same read back three ways, refused when bad, removed
    t = summary["tenant"]
    zero = {"input_tokens": 0, "output_tokens": 0, "tokens": 0, "cost_usd": 0, "calls": 0}
    assert t["set"] == {
        "tenant": "acme",
        "budget": {
            "max_tokens_per_day": 100_000,
            "max_cost_usd_per_day": None,
            "max_tokens_per_month": None,
            "max_cost_usd_per_month": 50,
        },
        "day": t["set"]["day"],
        "today": zero,
        "this_month": zero,
        "reached": "",
    }
    assert t["read"] == t["listed"] == t["in_snapshot"] == t["set"]
    # none of the four limits, a limit below 1, a name that is no tenant's
    assert t["refused"] == ["422 invalid_request"] * 3
    assert t["after_refusals"] == t["set"]["budget"]  # a refused budget changed nothing
    assert t["removed"] == {**t["set"], "budget": None}
    acme = rig.client.get_tenant("acme")
    assert (acme["budget"], acme["day"]) == (None, t["set"]["day"])

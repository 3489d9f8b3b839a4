"""The dex command against a real server: approve a waiting tool call, and clear errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dex.testing import wait_until
from tests.support.rig import Rig


def dex(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dex", *args, "--address", rig.server.address],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_person_approves_from_the_command_line(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")  # waits until the Worker registered the agent
    created = dex(rig, "new", "waiter", "--json")
    assert created.returncode == 0, created.stderr
    sid = json.loads(created.stdout)["id"]
    turn = rig.call(sid, ("delete_all", {}))
    wait_until(lambda: rig.client.list_approvals(sid), 10, what="an approval is pending")

    listed = dex(rig, "approvals", sid, "--json")
    (pending,) = json.loads(listed.stdout)
    table = dex(rig, "approvals", sid)
    [row] = [line for line in table.stdout.splitlines() if pending["call_id"] in line]
    assert "delete_all()" in row and pending["arguments_hash"] in row
    approved = dex(
        rig,
        "approve",
        sid,
        pending["call_id"],
        "--by",
        "ops",
        "--arguments-hash",
        pending["arguments_hash"],
    )
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == f"approved {pending['call_id']}: it runs once\n"
    t = rig.wait_turn(sid, turn)
    assert t["tool_calls"][0]["status"] == "succeeded"
    assert t["tool_calls"][0]["approval"]["by"] == "ops"
    assert len(rig.ledger.entries("delete_all")) == 1

    again = dex(rig, "approve", sid, pending["call_id"])
    assert again.returncode == 1
    assert again.stderr.startswith("error: ") and "Traceback" not in again.stderr
    missing = dex(rig, "snapshot", "no-such-session")
    assert missing.returncode == 1 and "unknown session" in missing.stderr


def test_dex_workers_shows_who_serves_what(rig: Rig) -> None:
    rig.start_server()
    none = dex(rig, "workers")
    assert none.returncode == 0 and "no Worker is connected" in none.stdout
    refused = dex(rig, "new", "waiter")  # nobody serves it yet: the error says what to do
    assert refused.returncode == 1 and "start a Worker that defines it" in refused.stderr
    rig.start_worker()
    rig.session("waiter")
    listed = dex(rig, "workers", "--json")
    assert listed.returncode == 0, listed.stderr
    (worker,) = json.loads(listed.stdout)
    names = {a["name"]: a["tools"] for a in worker["agents"]}
    assert "delete_all" in names["waiter"] and worker["capacity"] == 16
    table = dex(rig, "workers")
    assert worker["worker_id"] in table.stdout and "serves" in table.stdout
    assert "node" not in worker and " node " not in table.stdout  # a node alone

    alone = dex(rig, "cluster")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout == "a single node: it serves every session itself (no cluster)\n"
    view = json.loads(dex(rig, "cluster", "--json").stdout)
    assert view == {"node_id": None, "partition_count": None, "members": []}


def test_dex_events_follows_a_session(rig: Rig) -> None:
    import threading

    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    follower = subprocess.Popen(
        [sys.executable, "-m", "dex", "events", sid, "--address", rig.server.address],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: (
            lines.extend(iter(follower.stdout.readline, "")) if follower.stdout else None
        ),
        daemon=True,
    )
    reader.start()
    try:
        # send until the follower shows a turn's end: a turn that ended before it
        # subscribed is not streamed to it
        def seen_a_turn_end() -> bool:
            if not any("turn.completed" in line for line in lines):
                rig.client.send_message(sid, "hello", wait=True)
                return False
            return True

        wait_until(seen_a_turn_end, 20, 0.5, what="dex events printed a turn's end")
        assert any("history.item" in line and "echo: hello" in line for line in lines)
    finally:
        follower.terminate()
        follower.wait(10)
        if follower.stdout is not None:
            follower.stdout.close()


def test_dex_fork_makes_a_session_with_the_history_before_a_turn(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    for _ in range(2):
        rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "k"})))
    forked = dex(rig, "fork", sid, "--turn", "2", "--session-id", "again", "--json")
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout)["forked_from"] == {"session_id": sid, "turn": 2}
    original = rig.client.get_agent_snapshot(sid)["history"]
    starts = [i for i, item in enumerate(original) if item["type"] == "user"]
    assert rig.client.get_agent_snapshot("again")["history"] == original[: starts[1]]
    missing = dex(rig, "fork", sid, "--turn", "7")
    assert missing.returncode == 1 and "has no turn 7" in missing.stderr


ISO_LOCAL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")


@pytest.mark.timeout(240)  # nine dex commands, each a process of its own
def test_dex_send_returns_at_an_approval_and_inbox_and_sessions_show_it(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    idle = rig.session("waiter")
    sid = rig.session("waiter")

    sent = dex(rig, "send", sid, 'call: [["delete_all", {}]]', "--wait", "60", "--json")

    assert sent.returncode == 0, sent.stderr
    turn = json.loads(sent.stdout)
    assert turn["status"] == "waiting" and turn["waiting_for"][0]["tool"] == "delete_all"
    assert "waits: approve delete_all()" in sent.stderr
    assert f"dex approve {sid} 1.1" in sent.stderr

    inbox = dex(rig, "inbox")
    assert inbox.returncode == 0, inbox.stderr
    [line] = [line for line in inbox.stdout.splitlines() if sid in line]
    assert "1.1" in line and "approve delete_all()" in line and ISO_LOCAL.search(line)

    waiting = dex(rig, "sessions", "--status", "waiting")
    [row] = [line for line in waiting.stdout.splitlines() if sid in line]
    assert "waiting" in row and len(ISO_LOCAL.findall(row)) == 3  # created, updated, since
    assert idle not in waiting.stdout
    page = dex(rig, "sessions", "--limit", "1", "--created-since", "1h")
    assert sid in page.stdout and idle not in page.stdout  # newest first
    cursor = page.stderr.split("--cursor ")[1].split()[0]
    rest = json.loads(dex(rig, "sessions", "--limit", "1", "--cursor", cursor, "--json").stdout)
    assert [s["id"] for s in rest["sessions"]] == [idle] and rest["next_cursor"] is None

    bad = dex(rig, "sessions", "--created-since", "yesterday")
    assert bad.returncode == 2 and "is not a time" in bad.stderr
    stale = dex(rig, "sessions", "--cursor", "not-a-cursor")
    assert stale.returncode == 1 and "error: the cursor is not one" in stale.stderr

    rig.client.approve(sid, "1.1")
    assert rig.wait_turn(sid, turn["turn"])["status"] == "completed"
    assert "nothing waits for a person" in dex(rig, "inbox").stdout


def test_dex_new_and_send_sum_up_and_dex_turn_shows_the_steps(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session()  # the agent is registered

    created = dex(rig, "new", "assistant")
    assert created.returncode == 0, created.stderr
    first, hint = created.stdout.splitlines()
    sid = first.split()[1]
    assert first == f"session {sid} with agent assistant: idle"
    assert hint == f"send it a message: dex send {sid} TEXT"

    sent = dex(rig, "send", sid, 'call: [["lookup", {"key": "k"}], ["flaky", {}]]')
    assert sent.returncode == 0, sent.stderr
    lines = sent.stdout.splitlines()
    assert lines[0].startswith("turn 1 completed in ")
    assert lines[1].strip() == '1.1 lookup(key="k") succeeded: {"key": "k", "value": "K"}'
    assert lines[2].strip() == "1.2 flaky() failed: RuntimeError: flaky failure on attempt 2"
    assert lines[-1] == f"its Steps and attempts: dex turn {sid} 1"
    assert len(lines) <= 6  # not the whole turn
    whole = json.loads(dex(rig, "send", sid, "hello", "--json").stdout)
    assert whole["turn"] == 2 and whole["steps"][0]["attempts"][0]["number"] == 1

    shown = dex(rig, "turn", sid, "1")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert out[0].startswith("turn 1 completed")
    [step] = [line for line in out if "1.2 flaky()" in line and "CallTool" in line]
    step_part, attempt_part = step.split()[:5], step.split()[5:8]
    assert step_part == ["1.3", "CallTool", "failed", "1.2", "flaky()"]
    assert attempt_part == ["1", "failed", "NOT_COMPLETED"]
    assert step.endswith("RuntimeError: flaky failure on attempt 1")
    [retry] = [line for line in out if line.split()[:3] == ["2", "failed", "NOT_COMPLETED"]]
    assert retry.endswith("RuntimeError: flaky failure on attempt 2")  # the Step's next row
    assert sum("RunModel" in line for line in out) == 2
    assert json.loads(dex(rig, "turn", sid, "1", "--json").stdout)["steps"][2]["id"] == "1.3"

    missing = dex(rig, "turn", sid, "7")
    assert missing.returncode == 1 and f"session {sid} has no turn 7" in missing.stderr


def test_dex_reconcile_keeps_every_option_or_refuses_it(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 30, "gate": "g"}))
    rig.wait_entered("g", 1)
    worker.kill()  # the charge may have run: its outcome is unknown
    rig.start_worker()
    assert rig.wait_turn(sid, turn)["tool_calls"][0]["status"] == "outcome_unknown"

    def call() -> dict[str, object]:
        (found,) = rig.client.get_agent_snapshot(sid)["tool_calls"]
        return found  # type: ignore[no-any-return]

    failed_with_result = dex(
        rig, "reconcile", sid, "1.1", "--status", "failed", "--result", '"never written"'
    )
    assert failed_with_result.returncode == 2
    assert "a call that failed has no result" in failed_with_result.stderr
    succeeded_with_error = dex(
        rig, "reconcile", sid, "1.1", "--status", "succeeded", "--error", "declined"
    )
    assert succeeded_with_error.returncode == 2
    assert "a call that succeeded has no error" in succeeded_with_error.stderr
    assert call()["status"] == "outcome_unknown"  # refused: nothing changed

    done = dex(
        rig,
        "reconcile",
        sid,
        "1.1",
        "--status",
        "failed",
        "--error",
        "never written",
        "--by",
        "ops",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        'reconciled: 1.1 charge(amount=30, gate="g") failed (reconciled by ops): never written'
    )
    settled = call()
    assert settled["status"] == "failed" and settled["error"] == "never written"
    assert settled["reconciled"]["by"] == "ops"  # type: ignore[index]


def test_dex_limits_sets_shows_and_clears_a_groups_limits(rig: Rig) -> None:
    rig.start_server()
    empty = dex(rig, "limits")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("no model group has limits")
    set_ = dex(rig, "limits", "set", "openai/gpt-5", "--concurrency", "4", "--tpm", "30000")
    assert set_.returncode == 0, set_.stderr
    assert set_.stdout == ("openai/gpt-5  concurrency 4, tpm 30000 (api)  running 0  waiting 0\n")
    (group,) = json.loads(dex(rig, "limits", "--json").stdout)
    assert group["limit"] == {"concurrency": 4, "rpm": None, "tpm": 30000}
    bad = dex(rig, "limits", "set", "openai/gpt-5", "--concurrency", "0")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")
    assert "concurrency" in bad.stderr and "Traceback" not in bad.stderr
    cleared = dex(rig, "limits", "clear", "openai/gpt-5")
    assert cleared.returncode == 0 and cleared.stdout.startswith("no model group has limits")


def test_dex_budget_raises_a_budget_the_turn_waits_for(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    created = dex(rig, "new", "spender", "--max-tokens", "1000", "--json")
    assert created.returncode == 0, created.stderr
    sid = json.loads(created.stdout)["id"]

    sent = dex(rig, "send", sid, 'call: [["lookup", {"key": "k"}]]', "--wait", "60")
    assert sent.returncode == 0, sent.stderr
    assert "waits: a bigger budget: 1100 tokens used of a budget of 1000" in sent.stderr
    assert f"dex budget {sid} --max-tokens N" in sent.stderr
    inbox = dex(rig, "inbox")
    [line] = [line for line in inbox.stdout.splitlines() if sid in line]
    assert "a bigger budget" in line
    listed = dex(rig, "sessions", "--status", "waiting")
    [row] = [line for line in listed.stdout.splitlines() if sid in line]
    assert "1,100 tokens $0.0045" in row

    shown = dex(rig, "budget", sid)
    assert shown.stdout.strip() == (
        f"session {sid}: 1,000 tokens; used 1,100 tokens $0.0045; waiting"
    )
    bad = dex(rig, "budget", sid, "--max-cost-usd", "-1")
    assert bad.returncode == 1 and "max_cost_usd" in bad.stderr
    raised = dex(rig, "budget", sid, "--max-tokens", "5000", "--max-cost-usd", "0.5")
    assert raised.returncode == 0, raised.stderr
    assert raised.stdout.strip() == (
        f"session {sid}: 5,000 tokens, $0.5; used 1,100 tokens $0.0045; running"
    )
    assert rig.wait_turn(sid, 1)["status"] == "completed"
    removed = json.loads(dex(rig, "budget", sid, "--remove", "--json").stdout)
    assert removed["budget"] is None and removed["usage"]["input_tokens"] == 2_000


def test_dex_tenants_sets_shows_and_removes_a_tenant_s_budget_its_turns_wait_for(
    rig: Rig,
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    empty = dex(rig, "tenants")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("no tenant has a budget")
    set_ = dex(rig, "tenants", "budget", "acme", "--max-tokens-per-day", "1000", "--by", "ops")
    assert set_.returncode == 0, set_.stderr
    assert set_.stdout == (
        "acme  1,000 tokens a day  today 0 tokens $0.0000  this month 0 tokens $0.0000\n"
    )
    created = dex(rig, "new", "spender", "--tenant", "acme", "--json")
    assert created.returncode == 0, created.stderr
    sid = json.loads(created.stdout)["id"]

    sent = dex(rig, "send", sid, 'call: [["lookup", {"key": "k"}]]', "--wait", "60")
    assert sent.returncode == 0, sent.stderr
    reason = "tenant acme: 1100 tokens used today of 1000"
    assert f"waits: a bigger budget: {reason}" in sent.stderr
    assert "dex tenants budget acme --max-tokens-per-day N" in sent.stderr
    assert f"dex budget {sid}" not in sent.stderr  # the session's own budget is not it
    listed = dex(rig, "tenants")
    assert listed.stdout == (
        "acme  1,000 tokens a day  today 1,100 tokens $0.0045  this month 1,100 tokens $0.0045"
        f"  used up: {reason}\n"
    )
    shown = json.loads(dex(rig, "tenants", "show", "acme", "--json").stdout)
    assert shown["reached"] == reason and shown["today"]["calls"] == 1
    other = dex(rig, "tenants", "show", "nobody")
    assert other.stdout.startswith("nobody  no budget  today 0 tokens")

    for args, says in (
        (("acme",), "give a limit"),
        (("acme", "--remove", "--max-tokens-per-day", "5"), "either --remove or new limits"),
        (("acme", "--max-tokens-per-day", "0"), "--max-tokens-per-day"),
    ):
        bad = dex(rig, "tenants", "budget", *args)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr
    for args, says in (
        (("acme", "--max-cost-usd-per-day", "-1"), "max_cost_usd_per_day"),
        (("no such tenant", "--max-tokens-per-day", "5"), "tenant"),
    ):
        bad = dex(rig, "tenants", "budget", *args)
        assert bad.returncode == 1 and bad.stderr.startswith("error: "), bad.stderr
        assert says in bad.stderr and "Traceback" not in bad.stderr
    assert rig.client.wait_turn(sid, 1, timeout=0)["status"] == "waiting"

    raised = dex(
        rig,
        "tenants",
        "budget",
        "acme",
        "--max-tokens-per-day",
        "10000",
        "--max-cost-usd-per-month",
        "5",
    )
    assert raised.returncode == 0, raised.stderr
    assert raised.stdout.startswith("acme  10,000 tokens a day, $5 a month  today ")
    assert "used up" not in raised.stdout
    assert rig.wait_turn(sid, 1)["status"] == "completed"
    removed = json.loads(dex(rig, "tenants", "budget", "acme", "--remove", "--json").stdout)
    assert removed["budget"] is None and removed["today"]["tokens"] == 2_200

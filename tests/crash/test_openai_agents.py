"""The OpenAI Agents SDK adapter under crashes: real server and Worker processes, the real
SDK, a fake OpenAI server in this process. A segment (RunModel) repeats with everything
that runs inside it; a Dex tool Step follows the row of its kind, and the resumed
segment gives the model what Dex recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dex.testing.fake_providers import FakeOpenAI
from tests.crash.helpers import columns, interrupt, interrupt_and_reconnect
from tests.support.framework_agents import script
from tests.support.rig import AnyWorker, Rig, attempts, make_rig

FRAMEWORK_AGENTS = str(Path(__file__).parent.parent / "support" / "framework_agents.py")


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(script).in_thread() as server:
        yield server


@pytest.fixture
def rig(model: FakeOpenAI, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The rig, made once the fake model listens: its server's port is then surely free."""
    r = make_rig(tmp_path, request)
    try:
        yield r
    finally:
        r.close()


def start(rig: Rig, model: FakeOpenAI, failpoints: str = "") -> AnyWorker:
    """The server, and a Worker serving the framework agent (as will every new Worker)."""
    rig.worker_module = FRAMEWORK_AGENTS
    rig.worker_env = {
        "DEX_TEST_PROVIDER_URL": model.base_url,
        "DEX_TEST_PROVIDER_KEY": model.api_key or "",
    }
    rig.start_server()
    return rig.start_worker(failpoints)


def outputs(turn: dict[str, Any]) -> list[str]:
    """The tool outputs the model read last (the fake model answers with them)."""
    text: str = turn["text"] or ""
    assert text.startswith("results: "), f"unexpected final answer: {text!r}"
    parsed: list[str] = json.loads(text.removeprefix("results: "))
    return parsed


def ask(rig: Rig, session: str, *calls: tuple[str, dict[str, Any]]) -> int:
    turn: int = rig.client.send_message(session, "call: " + json.dumps([list(c) for c in calls]))[
        "turn"
    ]
    return turn


@columns("framework_tool.running", takeover=True)
def test_a_tool_the_framework_runs_inline_runs_again_with_its_segment(
    rig: Rig, model: FakeOpenAI, column: str
) -> None:
    worker = start(rig, model)
    sid = rig.session("framework")
    turn = ask(rig, sid, ("clock", {"gate": "clock"}))
    rig.wait_entered("clock", 1)

    worker = interrupt_and_reconnect(rig, column, worker)
    rig.wait_entered("clock", 2)  # the segment runs again, and the tool with it
    rig.open_gate("clock")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed", t
    assert outputs(t) == ["12:00"]
    assert len(rig.ledger.entries("clock")) == 2  # at-least-once: it ran in both attempts
    assert attempts(t, "RunModel") == [[(1, "failed"), (2, "succeeded")]]
    assert t["tool_calls"] == []  # Dex never saw the call: it ran inside RunModel


@columns("single_attempt.running")
def test_a_deferred_write_interrupted_records_outcome_unknown_and_the_model_reads_it(
    rig: Rig, model: FakeOpenAI, column: str
) -> None:
    worker = start(rig, model)
    sid = rig.session("framework")
    turn = ask(rig, sid, ("charge", {"amount": 5, "gate": "charge"}), ("upsert", {"key": "k"}))
    rig.wait_entered("charge", 1)

    interrupt(rig, column, worker)
    rig.open_gate("charge")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed", t
    assert len(rig.ledger.entries("charge")) == 1  # never run again
    charge, upsert = t["tool_calls"]
    assert (charge["status"], upsert["status"]) == ("outcome_unknown", "succeeded")
    # the resumed SDK run gave the model Dex's records, the unknown outcome included
    unknown, stored = outputs(t)
    assert unknown == f"outcome_unknown: {charge['error']}"
    assert stored == json.dumps("stored k")
    assert [s["type"] for s in t["steps"]] == [
        "RunModel",
        "CallSingleAttemptTool",
        "CallTool",
        "RunModel",
    ]


@columns("idempotent_write.running")
def test_a_deferred_idempotent_write_interrupted_runs_again_with_the_same_key(
    rig: Rig, model: FakeOpenAI, column: str
) -> None:
    worker = start(rig, model)
    sid = rig.session("framework")
    turn = ask(rig, sid, ("upsert", {"key": "k", "gate": "upsert"}))
    rig.wait_entered("upsert", 1)

    interrupt(rig, column, worker)
    rig.wait_entered("upsert", 2)
    rig.open_gate("upsert")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed", t
    runs = rig.ledger.entries("upsert")
    assert [r["attempt"] for r in runs] == [1, 2]
    assert len({r["idempotency_key"] for r in runs}) == 1
    assert outputs(t) == [json.dumps("stored k")]


@columns("run_model.before_output")
def test_a_resumed_segment_interrupted_runs_again_from_the_stored_run_state(
    rig: Rig, model: FakeOpenAI, column: str
) -> None:
    # the second RunModel (the segment that resumes after the tool) pauses before output
    worker = start(rig, model, failpoints="worker.run_model.before_output=pause@2")
    sid = rig.session("framework")
    turn = ask(rig, sid, ("charge", {"amount": 7}))
    rig.wait_failpoint("worker.run_model.before_output")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.run_model.before_output")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed", t
    assert len(rig.ledger.entries("charge")) == 1  # the write is not part of the segment
    assert outputs(t) == [json.dumps("charged 7")]
    assert attempts(t, "RunModel") == [[(1, "succeeded")], [(1, "failed"), (2, "succeeded")]]
    # The model's own count: the first segment's call, and the resumed segment's attempt 2.
    # A killed Worker stopped before attempt 1's call; one that ran on through a takeover,
    # released, made it late (its result was refused).
    assert len(model.requests) == 2

"""The Claude Agent SDK adapter under crashes: real server and Worker processes, the real
SDK and its bundled CLI, a fake Anthropic server in this process. A segment repeats with
the CLI tools that ran inside it; a deferred Dex tool runs in its own Step, as its kind
says, and the resumed session gives the model what Dex recorded."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dex.testing import wait_until
from dex.testing.fake_providers import Entry, FakeAnthropic, Reply, ScriptedCall
from tests.crash.helpers import columns, interrupt
from tests.support.rig import AnyWorker, Rig, attempts, make_rig

CLAUDE_AGENTS = str(Path(__file__).parent.parent / "support" / "claude_agents.py")
Script = Callable[[dict[str, Any]], Entry]


class Conversation:
    """What the CLI sent: the tool calls in order and their results by call id."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.calls: list[tuple[str, str]] = []
        self.results: dict[str, tuple[str, bool]] = {}
        for message in body["messages"]:
            content = message["content"]
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_use":
                    self.calls.append((block["id"], block["name"]))
                elif block.get("type") == "tool_result":
                    text = block.get("content")
                    if isinstance(text, list):
                        text = "".join(part.get("text", "") for part in text)
                    self.results[block["tool_use_id"]] = (str(text), bool(block.get("is_error")))

    def answered(self, name: str) -> bool:
        return any(n == name and cid in self.results for cid, n in self.calls)

    def final(self) -> Reply:
        texts = [self.results[cid][0] for cid, _ in self.calls if cid in self.results]
        return Reply("results: " + json.dumps(texts))


@pytest.fixture
def script() -> list[Script]:
    """The fake model's script, set by the test (a list, so the fixture can be shared)."""
    return []


@pytest.fixture
def model(script: list[Script]) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(lambda body: script[0](body)).in_thread() as server:
        yield server


@pytest.fixture
def rig(model: FakeAnthropic, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The rig, made once the fake model listens: its server's port is then surely free."""
    r = make_rig(tmp_path, request)
    r.worker_module = CLAUDE_AGENTS
    r.worker_env = {
        "DEX_TEST_PROVIDER_URL": model.base_url,
        "DEX_TEST_PROVIDER_KEY": model.api_key or "",
        "DEX_TEST_CWD": str(tmp_path),
    }
    try:
        yield r
    finally:
        r.close()


def children(worker: AnyWorker) -> list[int]:
    """The processes the Worker started (its CLIs)."""
    assert worker.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == worker.proc.pid:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def outputs(turn: dict[str, Any]) -> list[str]:
    text: str = turn["text"] or ""
    assert text.startswith("results: "), f"unexpected final answer: {text!r}"
    parsed: list[str] = json.loads(text.removeprefix("results: "))
    return parsed


@columns("claude_agent_sdk.segment", takeover=True)
def test_a_segment_repeats_with_its_cli_tools_and_not_its_deferred_calls(
    rig: Rig, script: list[Script], column: str
) -> None:
    ledger, gates = rig.ledger.path, rig.gates
    bash = (
        f'echo \'{{"effect": "bash"}}\' >> {ledger}; n=$(grep -c bash {ledger}); '
        f"touch {gates}/bash.$n.entered; "
        f"while [ ! -f {gates}/bash.open ]; do sleep 0.01; done; echo slept"
    )

    def model(body: dict[str, Any]) -> Entry:
        seen = Conversation(body)
        if not seen.calls:
            return Reply(tool_calls=[ScriptedCall("mcp__dex__charge", {"amount": 5})])
        if not seen.answered("Bash"):
            if any(n == "Bash" for _, n in seen.calls):
                return Reply("unexpected: Bash without a result")
            return Reply(tool_calls=[ScriptedCall("Bash", {"command": bash})])
        return seen.final()

    script.append(model)
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("coder")
    turn = rig.client.send_message(sid, "charge, then run the script")["turn"]
    rig.wait_entered("bash", 1)  # the second segment runs Bash inside the CLI
    clis = children(worker)

    worker = interrupt(rig, column, worker)
    rig.wait_entered("bash", 2)  # the segment runs again, and Bash with it
    rig.open_gate("bash")
    t = rig.wait_turn(sid, turn, timeout=60)

    assert t["status"] == "completed", t
    assert len(rig.ledger.entries("charge")) == 1  # the deferred call ran once, as a Step
    first, second = attempts(t, "RunModel")
    assert first[-1][1] == "succeeded"
    # the interrupted segment ran again (a loaded machine may fail one more attempt by
    # heartbeat timeout: each failed attempt is one more repeat)
    assert [outcome for _, outcome in second] == ["failed"] * (len(second) - 1) + ["succeeded"]
    # the CLI tool ran once per attempt that reached it: at-least-once
    assert 2 <= len(rig.ledger.entries("bash")) <= len(second)
    charged, slept = outputs(t)
    assert charged == json.dumps("charged 5")
    assert slept.startswith("slept")  # the CLI may append a reminder to a tool's output
    assert [c["name"] for c in t["tool_calls"]] == ["charge"]  # Dex never saw Bash
    # the killed Worker's CLI outlives it until it finds its parent gone
    try:
        wait_until(lambda: all(gone(pid) for pid in clis), 20, what="the orphaned CLI exits")
    finally:
        for pid in clis:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@columns("single_attempt.running")
def test_a_deferred_write_interrupted_records_outcome_unknown_and_the_session_reads_it(
    rig: Rig, script: list[Script], column: str
) -> None:
    def model(body: dict[str, Any]) -> Entry:
        seen = Conversation(body)
        if not seen.calls:
            return Reply(
                tool_calls=[ScriptedCall("mcp__dex__charge", {"amount": 5, "gate": "charge"})]
            )
        return seen.final()

    script.append(model)
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("coder")
    turn = rig.client.send_message(sid, "charge 5")["turn"]
    rig.wait_entered("charge", 1)

    interrupt(rig, column, worker)
    rig.open_gate("charge")
    t = rig.wait_turn(sid, turn, timeout=60)

    assert t["status"] == "completed", t
    assert len(rig.ledger.entries("charge")) == 1  # never run again
    [charge] = t["tool_calls"]
    assert charge["status"] == "outcome_unknown"
    [unknown] = outputs(t)
    assert unknown == f"outcome_unknown: {charge['error']}"
    assert [s["type"] for s in t["steps"]] == ["RunModel", "CallSingleAttemptTool", "RunModel"]

"""A rig of real processes for end-to-end and crash tests: one server node, Workers, a
ledger, gates and failpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.testing import Ledger, ServerProcess, WorkerProcess, wait_until

AGENTS = str(Path(__file__).with_name("agents.py"))
HEARTBEAT_TIMEOUT = 1.0


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gates = tmp / "gates"
        self.failpoints = tmp / "failpoints"
        self.gates.mkdir()
        self.failpoints.mkdir()
        self.ledger = Ledger(tmp / "ledger.jsonl")
        self.server = ServerProcess(tmp / "data", heartbeat_timeout=HEARTBEAT_TIMEOUT)
        self.workers: list[WorkerProcess] = []
        self.worker_module = AGENTS
        """What ``start_worker`` serves unless told otherwise (a crash helper's new Worker too)."""
        self.worker_env: dict[str, str] = {}
        self.client = dex.SyncClient(self.server.address, timeout=30)

    # --- processes ---------------------------------------------------------------

    def start_worker(
        self, failpoints: str = "", *, module: str | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(
            module or self.worker_module,
            self.server.address,
            self.tmp / f"worker-{len(self.workers) + 1}.log",
            env={
                "DEX_TEST_LEDGER": str(self.ledger.path),
                "DEX_TEST_GATES": str(self.gates),
                "DEX_FAILPOINTS": failpoints,
                "DEX_FAILPOINT_DIR": str(self.failpoints),
                **self.worker_env,
                **(env or {}),
            },
        )
        self.workers.append(worker.start())
        return worker

    def restart_server(self) -> None:
        """SIGKILL the node and start it again on the same data directory and port."""
        self.server.kill()
        self.server.start()

    def start_server(self, failpoints: str = "") -> None:
        self.server.start(
            env={"DEX_FAILPOINTS": failpoints, "DEX_FAILPOINT_DIR": str(self.failpoints)}
        )

    def wait_failpoint(self, name: str, timeout: float = 20) -> None:
        wait_until(
            lambda: (self.failpoints / f"{name}.hit").exists(),
            timeout,
            what=f"failpoint {name} reached",
        )

    def release_failpoint(self, name: str) -> None:
        (self.failpoints / f"{name}.release").write_text("")

    def wait_entered(self, gate: str, attempt: int, timeout: float = 20) -> None:
        wait_until(
            lambda: (self.gates / f"{gate}.{attempt}.entered").exists(),
            timeout,
            what=f"tool behind gate {gate} running as attempt {attempt}",
        )

    def open_gate(self, gate: str) -> None:
        (self.gates / f"{gate}.open").write_text("")

    # --- the conversation ------------------------------------------------------------

    def session(self, agent: str = "assistant") -> str:
        wait_until(
            lambda: any(a["name"] == agent for a in self.client.list_agents()),
            20,
            what=f"agent {agent} registered",
        )
        session_id: str = self.client.create_session(agent)["id"]
        return session_id

    def call(self, session_id: str, *calls: tuple[str, dict[str, Any]]) -> int:
        """Send a message asking for these tool calls; return its turn number."""
        text = "call: " + json.dumps([list(c) for c in calls])
        turn: int = self.client.send_message(session_id, text)["turn"]
        return turn

    def wait_turn(self, session_id: str, turn: int, timeout: float = 30) -> dict[str, Any]:
        result: dict[str, Any] = self.client.wait_turn(session_id, turn, timeout=timeout)
        assert result["status"] != "running", f"turn {turn} still running after {timeout}s"
        return result

    def current_step(self, session_id: str, type_: str) -> dict[str, Any] | None:
        turn = self.client.get_agent_snapshot(session_id)["current_turn"]
        steps = [s for s in (turn or {}).get("steps", []) if s["type"] == type_]
        return steps[-1] if steps else None

    def close(self) -> None:
        self.client.close()
        for worker in self.workers:
            worker.kill()
        self.server.kill()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def results(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """What the model saw as tool results in the turn's last RunModel (the test script
    answers with them)."""
    text = turn["text"] or ""
    assert text.startswith("results: "), f"unexpected final answer: {text!r}"
    parsed: list[dict[str, Any]] = json.loads(text.removeprefix("results: "))
    return parsed


def attempts(turn: dict[str, Any], step_type: str) -> list[list[tuple[int, str]]]:
    """(number, outcome) of every attempt, per Step of that type, in order."""
    return [
        [(a["number"], a["outcome"]) for a in s["attempts"]]
        for s in turn["steps"]
        if s["type"] == step_type
    ]

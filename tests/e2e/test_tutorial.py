"""docs/tutorial.md, run as written: its agent file and its `dex` commands, with the
Worker SIGKILLed while the tool runs. (Its install step is tests/e2e/test_packaging.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until

TUTORIAL = Path(__file__).parents[2] / "docs" / "tutorial.md"
RUN = [
    "dex server --data-dir ./dex-data",
    "dex worker reports.py",
    "dex new reporter --session-id first",
    'dex send first "Report on Paris, please" --wait 0',
    "dex turn first 1",
]
"""Every `dex` command of the tutorial's shell blocks, in order (repeats dropped)."""


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), re.S)


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    commands = [
        line.strip()
        for block in blocks("bash")
        for line in block.splitlines()
        if line.strip().startswith("dex ") and line.strip() != "dex --version"
    ]
    assert list(dict.fromkeys(commands)) == RUN  # the test runs what the page says
    (agent_file,) = blocks("python")
    (tmp_path / "reports.py").write_text(agent_file)

    server = ServerProcess(tmp_path / "dex-data").start()  # dex server --data-dir ...
    agents = str(tmp_path / "reports.py")
    workers = [WorkerProcess(agents, server.address, tmp_path / f"worker-{n}.log") for n in (1, 2)]

    def dex_(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dex", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DEX_ADDRESS": server.address},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    client = dex.SyncClient(server.address, timeout=30)
    try:
        workers[0].start()  # dex worker reports.py
        wait_until(lambda: client.list_agents(), 20, what="the Worker registered")
        created = dex_("new", "reporter", "--session-id", "first")
        assert created.startswith("session first with agent reporter: idle")
        sent = dex_("send", "first", "Report on Paris, please", "--wait", "0")
        assert sent.splitlines() == ["turn 1 running", "its Steps and attempts: dex turn first 1"]

        def tool_runs() -> bool:  # what `dex turn first 1` shows, read quicker
            turn = client.get_agent_snapshot("first")["current_turn"] or {}
            steps = [s for s in turn.get("steps", []) if s["type"] == "CallTool"]
            return bool(steps) and steps[-1]["attempts"][-1]["outcome"] == "running"

        wait_until(tool_runs, 20, 0.02, what="the tool runs")
        workers[0].kill()  # SIGKILL, mid-tool
        workers[1].start()  # dex worker reports.py, again
        turn = client.wait_turn("first", 1, timeout=30)
        assert turn["status"] == "completed"

        shown = dex_("turn", "first", "1").splitlines()
        assert shown[0].startswith("turn 1 completed")
        assert "text: Here is your report. Paris: 21 degrees, attempt 2" in shown
        [failed] = [line for line in shown if "CallTool" in line]
        assert failed.split()[5:8] == ["1", "failed", "NOT_COMPLETED"]  # attempt 1
        assert failed.endswith("closed and it did not reconnect within 1s")
        assert any(line.split()[:2] == ["2", "succeeded"] for line in shown)  # attempt 2
        final = client.get_agent_snapshot("first")  # what `dex snapshot first` prints
        assert final["history"][-1]["text"] == "Here is your report. Paris: 21 degrees, attempt 2"
        (step,) = [s for s in turn["steps"] if s["type"] == "CallTool"]
        first, second = step["attempts"]
        assert (
            first["outcome"] == "failed"
            and "did not reconnect within 1s" in (first["error"]["message"])
        )
        assert first["error"]["attempt_progress"] == "NOT_COMPLETED"
        assert second["outcome"] == "succeeded"
    finally:
        client.close()
        for worker in workers:
            worker.kill()
        server.kill()

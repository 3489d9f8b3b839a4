"""docs/mcp.md, run as written: its MCP server and its agent files, and its `dex` commands,
with a real server and a real Worker process (which starts the MCP server over stdio)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until

PAGE = Path(__file__).parents[2] / "docs" / "mcp.md"
RUN = [
    "dex server --data-dir ./dex-data",
    "dex worker notes_agent.py",
    "dex new notetaker --session-id notes",
    'dex send notes "Save my groceries and mail them to Ann"',
]


def blocks(kind: str) -> list[str]:
    """The page's blocks of ``kind`` before "Dex agents over MCP" (test_mcp_server checks
    that section)."""
    tools_part = PAGE.read_text().split("\n## Dex agents over MCP\n")[0]
    return re.findall(rf"```{kind}\n(.*?)```", tools_part, re.S)


def test_the_mcp_example_runs_as_written(tmp_path: Path) -> None:
    commands = [
        line.strip()
        for block in blocks("bash")
        for line in block.splitlines()
        if line.strip().startswith("dex ")
    ]
    assert commands == RUN  # the test runs what the page says
    server_file, agent_file = blocks("python")
    (tmp_path / "notes_server.py").write_text(server_file)
    (tmp_path / "notes_agent.py").write_text(agent_file)

    server = ServerProcess(tmp_path / "dex-data").start()
    worker = WorkerProcess(str(tmp_path / "notes_agent.py"), server.address, tmp_path / "w.log")
    client = dex.SyncClient(server.address, timeout=30)

    def dex_(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dex", *args],
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "DEX_ADDRESS": server.address},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        worker.start()
        wait_until(lambda: client.list_agents(), 30, what="the Worker registered")
        (agent,) = client.list_agents()
        assert {t["name"]: t["kind"] for t in agent["tools"]} == {
            "list_notes": "read",
            "save_note": "idempotent_write",
            "email_note": "write",
        }
        dex_("new", "notetaker", "--session-id", "notes")
        dex_("send", "notes", "Save my groceries and mail them to Ann")
        turn = client.wait_turn("notes", 1, timeout=30)
        assert turn["status"] == "completed"
        assert turn["text"] == "Done: sent groceries to ann@example.com"
        assert [s["type"] for s in turn["steps"]] == [
            "RunModel",
            "CallTool",
            "RunModel",
            "CallSingleAttemptTool",
            "RunModel",
        ]
        assert [c["status"] for c in turn["tool_calls"]] == ["succeeded", "succeeded"]
        # the MCP server's own file: the note, and one email under the call's key
        stored = json.loads((tmp_path / "notes.json").read_text())
        assert stored["notes"] == {"groceries": "eggs"}
        email = turn["tool_calls"][1]
        assert stored["sent"] == {email["idempotency_key"]: "sent groceries to ann@example.com"}
    finally:
        client.close()
        worker.kill()
        server.kill()

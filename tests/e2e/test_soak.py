"""The short form of the chaos soak (``python -m bench.soak``), for CI: at least 50
SIGKILLs of Workers and of the node, with pauses and cut connections, while sessions run
turns with every kind of tool, approvals and timers; then every invariant must hold.

Select it with ``-m soak``, leave it out with ``-m "not soak"``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak
@pytest.mark.timeout(115)
def test_short_soak_keeps_every_promise_under_50_kills(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--sessions",
            "16",
            "--workers",
            "3",
            "--seconds",
            "70",
            "--max-kills",
            "55",
            "--worker-kill-every",
            "0.5",
            "--server-kill-every",
            "4",
            "--pause-every",
            "2.5",
            "--cut-every",
            "2.5",
            "--settle-seconds",
            "30",
            "--report",
            str(report_path),
            "--keep",
            str(tmp_path / "soak"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    output = done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    assert report["violations_by_kind"] == {}, output
    assert done.returncode == 0, output
    assert report["kills"] >= 50, output
    assert report["faults"]["kill_server"] >= 3, output
    assert report["turns"].get("completed", 0) >= 100, output
    statuses = {s for by_status in report["tool_calls_by_tool"].values() for s in by_status}
    assert {"succeeded", "outcome_unknown", "denied"} <= statuses, output
    assert set(report["tool_calls_by_tool"]) == {
        "lookup",
        "upsert",
        "charge",
        "transfer",
        "render",
        "nap",
    }, output

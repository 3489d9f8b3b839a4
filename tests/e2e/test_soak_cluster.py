"""The short form of the cluster chaos soak (``python -m bench.soak --cluster 3``), for
CI: three nodes without ``--standby`` on a private PostgreSQL, Workers connected to every
node, clients sending to any node, while nodes are SIGKILLed, paused, leave on purpose and
a fourth joins for a while; then every invariant holds and each of the 64 partitions is
owned by exactly one live node.

Select it with ``-m soak``, leave it out with ``-m "not soak"``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench.soak_postgres import _pg_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak
@pytest.mark.timeout(120)
def test_short_cluster_soak_keeps_every_promise(tmp_path: Path) -> None:
    try:
        _pg_tool("initdb")
    except RuntimeError as e:
        pytest.skip(str(e))
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--cluster",
            "3",
            "--sessions",
            "16",
            "--seconds",
            "25",
            "--server-kill-every",
            "5",
            "--pause-every",
            "4",
            "--worker-kill-every",
            "1",
            "--leave-every",
            "8",
            "--join-every",
            "8",
            "--settle-seconds",
            "30",
            "--seed",
            "11",
            "--report",
            str(report_path),
            "--keep",
            str(tmp_path / "soak"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=115,
    )
    output = done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    assert report["violations_by_kind"] == {}, output
    assert done.returncode == 0, output
    faults = report["faults"]
    assert faults.get("kill_node", 0) >= 2, output
    assert faults.get("leave", 0) >= 1, output
    assert faults.get("join", 0) >= 1, output
    assert faults.get("kill_worker", 0) >= 10, output
    assert report["partition_moves"] > 0, output
    assert report["turns"].get("completed", 0) >= 100, output
    statuses = {s for by_status in report["tool_calls_by_tool"].values() for s in by_status}
    assert {"succeeded", "denied"} <= statuses, output

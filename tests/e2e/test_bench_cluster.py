"""The short form of ``bench.cluster`` runs on PostgreSQL, prints every figure of issue
#34 (throughput with 1 and 2 nodes, the takeover of a killed, a hung and a stopping
node's partitions) and finds every message received once and answered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench import cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_cluster_short_prints_the_figures_and_loses_no_message(
    postgres_database: str,  # skips (a skip CI fails) when PostgreSQL cannot be reached
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--short"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    rows = [line.split() for line in out.splitlines()]
    throughput = [r for r in rows if r[:2] in (["1", "64"], ["2", "64"]) and len(r) == 10]
    assert [r[:2] for r in throughput] == [["1", "64"], ["2", "64"]], out
    assert all(int(r[2]) > 0 and r[6] == "0" for r in throughput), out  # turns, none failed
    cpu = [r for r in rows if r[:2] in (["1", "64"], ["2", "64"]) and len(r) == 11]
    assert [r[:2] for r in cpu] == [["1", "64"], ["2", "64"]], out
    assert "64 sessions, 2 nodes:" in out and "server CPU per turn" in out
    for kind, times in (("kill", 3), ("stop", 1), ("term", 1)):
        assert f"{cluster.NAMES[kind]}, 3 nodes, {times} times: gap p50" in out, out
    assert f"{cluster.NAMES['kill']}, 2 nodes, 1 times: gap p50" in out, out
    assert "messages sent to" in out and "sessions running at the end: OK" in out, out

"""The short form of ``bench.flow_cluster`` runs two nodes on PostgreSQL under a model
group's rate limit: no turn fails, the nodes together never admit more than the limit
(and its burst; the command exits 1 if they do), and it prints each phase's figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_flow_cluster_short_holds_the_limit_over_two_nodes(
    postgres_database: str,  # skips (a skip CI fails) when PostgreSQL cannot be reached
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.flow_cluster", "--short"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = {line[:30].strip(): line[30:].split() for line in done.stdout.splitlines()}
    for phase in ("one node", "two nodes, sessions spread", "two nodes, sessions on one"):
        calls, _, failed = rows[phase]
        assert float(calls) > 0 and failed == "0", done.stdout

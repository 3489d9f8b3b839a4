"""The short form of ``bench.flow`` runs and prints both figures of issue #36 item 6, and
its rate scenario keeps what holds on any machine: while the provider refuses calls, no
turn fails, no refusal uses an attempt, and no more calls reach the provider than the
group's rate and burst allow. Timing figures are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_flow_short_prints_the_figures_and_refusals_use_no_attempt() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.flow", "--short"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]  # 1 on any PROBLEM
    rows = [line.split() for line in out.splitlines()]
    no_limits = next(r for r in rows if r[:2] == ["no", "limits"] and len(r) == 9)
    limits = next(r for r in rows if r[:1] == ["limits"] and len(r) == 8)
    for row in (no_limits, limits):  # the admission table: turns ran, none failed
        assert int(row[-2]) > 0 and row[-1] == "0", out
    assert "limits / no limits, server CPU per turn:" in out
    assert "the gates alone, in process" in out

    fraction = next(r for r in rows if r[:1] == ["fraction"])
    turns, failed, attempts, refused, _, server = fraction[1:7]
    received, _, allowed = fraction[-3:]
    assert int(turns) > 0 and failed == "0", out
    assert attempts == "0", out  # refusals used no attempt ...
    assert int(refused) > 0 and float(server) > 0, out  # ... and there were refusals
    assert int(received) <= int(allowed), out  # the group's rate held

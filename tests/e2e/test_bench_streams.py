"""The short form of ``bench.streams`` runs and prints its figures for both backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_streams_short_prints_latency_and_idle_figures(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.streams", "--short"],
        cwd=ROOT,
        env={"DEX_BENCH_REDIS": redis_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] in (["memory"], ["redis"])]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        [(b, n) for b in ("memory", "redis") for n in ("1", "10", "100")]
    )
    latency = [r for r in rows if r[1] != "100"]
    assert all(r[2] == str(40 * int(r[1])) for r in latency)  # every delta reached everyone
    assert "Redis against memory, same run" in done.stdout

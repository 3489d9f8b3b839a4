"""bench.frontend serves the same answer both ways and measures each server's CPU."""

from __future__ import annotations

import argparse
import asyncio

from bench import frontend


def test_both_servers_answer_and_each_gets_a_cpu_figure() -> None:
    args = argparse.Namespace(clients=[2], seconds=0.3, rounds=1)
    text = asyncio.run(frontend.bench(args))
    (row,) = [line for line in text.splitlines() if line.split()[:1] == ["2"]]
    cells = row.replace("(", " ").replace(")", " ").split()
    uvicorn, bare = float(cells[1]), float(cells[4])
    # every request was answered (a failed one raises) and cost each server some CPU
    assert uvicorn > 0 and bare > 0
    assert cells[-1] == "µs"

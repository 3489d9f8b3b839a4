"""bench.creations' report: the medians of the interleaved rounds, and their ratio."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.creations import Code, report

from dex.testing import ServerProcess, WorkerProcess


def _code(name: str, tmp: Path, rates: list[float], cpu: list[float]) -> Code:
    server = ServerProcess(tmp / name)
    worker = WorkerProcess("agents.py", server.address, tmp / f"{name}.log")
    return Code(name, server, worker, rates=rates, cpu=cpu, client=[50e-6] * len(rates))


def test_the_report_gives_medians_and_the_ratio_against_the_baseline(tmp_path: Path) -> None:
    args = argparse.Namespace(clients=64, rounds=3, seconds=3.0, stored=0)
    codes = [
        _code("current", tmp_path, [3000, 4000, 5000], [200e-6, 250e-6, 300e-6]),
        _code("baseline", tmp_path, [2000, 2500, 9000], [400e-6, 500e-6, 100e-6]),
    ]
    text = report(codes, args, busy=1.2)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert rows["current"][1:2] == ["4,000"] and rows["current"][3] == "250"
    assert rows["baseline"][1:2] == ["2,500"] and rows["baseline"][3] == "400"
    assert rows["current/baseline"][1:3] == ["1.60x", "0.62x"]
    assert "MISSED" in text and "1.20 of them busy" in text

"""How long service stops when the active node fails, with a hot standby on PostgreSQL.

    .venv/bin/python -m bench.takeover [--kills 20] [--fault kill|stop|term]
    .venv/bin/python -m bench.takeover --kills 1000           # the long form

Two ``dex server`` nodes on one fresh PostgreSQL database, one Worker and one client that
know both addresses. The client runs short turns one after another (model -> a ``read``
tool -> model, ``bench/agents.py``), each sent with a ``message_id`` so a send repeated
across the gap is one message. Each round fails the active node and measures the gap:
from the fault to the first turn completed after it (on the new leader). Then the failed
node is started again as the standby, and the next round fails the new leader.

Faults: ``kill`` (SIGKILL: target p99 <= 2 s), ``stop`` (SIGSTOP, a hung leader whose
sockets stay open: the lease times out; target <= 4 s; the paused node is then killed),
``term`` (SIGTERM, a planned step-down: the node drains and releases the lease at once;
target <= 1 s).

It checks, and exits 1 if any fails: every turn sent completed exactly once, each new
leader's epoch is higher than the last, and exactly one node is ready after each round.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psycopg

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until

AGENTS = str(Path(__file__).with_name("agents.py"))
ADMIN_URL = os.environ.get("DEX_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGETS = {"kill": 2.0, "stop": 4.0, "term": 1.0}


@dataclass
class Result:
    gaps: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)
    """From the fault to the standby answering ``/readyz`` 200."""
    epochs: list[int] = field(default_factory=list)
    turns: int = 0
    problems: list[str] = field(default_factory=list)


class Turns(threading.Thread):
    """Runs turns one after another; records when each completed."""

    def __init__(self, address: str, session: str) -> None:
        super().__init__(daemon=True)
        self.address, self.session = address, session
        self.completed: list[float] = []
        self.stop = threading.Event()
        self.errors: list[str] = []

    def after(self, moment: float) -> list[float]:
        """When the turns that completed after ``moment`` did."""
        return [t for t in self.completed if t > moment]

    def run(self) -> None:
        with dex.SyncClient(self.address, timeout=60) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    turn = client.send_message(
                        self.session, f"turn {n}", message_id=f"m-{n}", wait=True
                    )
                except dex.DexError as e:
                    self.errors.append(f"turn {n}: {e}")
                    continue
                if turn["status"] != "completed":
                    self.errors.append(f"turn {n} ended {turn['status']}: {turn.get('error')}")
                self.completed.append(time.time())


def gone(node: ServerProcess) -> bool:
    return not node.alive


def epoch(node: ServerProcess) -> int:
    with urllib.request.urlopen(node.address + "/readyz", timeout=2) as r:
        return int(json.loads(r.read())["epoch"])


def run(kills: int, fault: str, directory: Path, database: str) -> Result:
    result = Result()
    nodes = [
        ServerProcess(directory / name, heartbeat_timeout=5.0, database=database)
        for name in ("a", "b")
    ]
    address = ",".join(n.address for n in nodes)
    nodes[0].start()
    nodes[1].start(ready=False)
    worker = WorkerProcess(AGENTS, address, directory / "worker.log").start()
    active, standby = nodes
    try:
        with dex.SyncClient(address, timeout=60) as client:
            wait_until(lambda: client.list_agents(), 30, what="the Worker registered")
            session = client.create_session("bench")["id"]
        turns = Turns(address, session)
        turns.start()
        result.epochs.append(epoch(active))
        for _ in range(kills):
            wait_until(lambda: len(turns.completed) >= 2, 30, what="turns run")
            failed_at = time.time()
            if fault == "kill":
                active.kill()
            elif fault == "stop":
                assert active.proc is not None
                active.proc.send_signal(signal.SIGSTOP)
            else:
                assert active.proc is not None
                active.proc.send_signal(signal.SIGTERM)
            wait_until(standby.ready, 30, 0.01, what="the standby took over")
            result.ready.append(time.time() - failed_at)
            first = wait_until(partial(turns.after, failed_at), 30, 0.005, "a turn done")
            result.gaps.append(first[0] - failed_at)
            result.epochs.append(epoch(standby))
            if fault == "stop":
                assert active.proc is not None
                active.proc.send_signal(signal.SIGCONT)  # it finds its lease lost and exits
                wait_until(partial(gone, active), 30, what="the paused node left")
            active.kill()
            active.start(ready=False)
            if active.ready():
                result.problems.append("two nodes ready after a round")
            active, standby = standby, active
            turns.completed.clear()
        turns.stop.set()
        turns.join(90)
        result.turns = len(turns.completed)
        result.problems += turns.errors
        with dex.SyncClient(address, timeout=60) as client:
            history = client.get_agent_snapshot(session)["history"]
        users = [item["text"] for item in history if item["type"] == "user"]
        if len(users) != len(set(users)):
            result.problems.append("a message is in the history twice")
        if result.epochs != sorted(set(result.epochs)):
            result.problems.append(f"epochs did not rise: {result.epochs}")
    finally:
        worker.kill()
        for node in nodes:
            if node.proc is not None and node.alive:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()
    return result


def fresh_database() -> tuple[str, str]:
    name = "dex_bench_" + secrets.token_hex(5)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return name, ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--fault", choices=sorted(TARGETS), default="kill")
    args = parser.parse_args(argv)
    name, url = fresh_database()
    try:
        with tempfile.TemporaryDirectory(prefix="dex-takeover-") as tmp:
            result = run(args.kills, args.fault, Path(tmp), url)
    finally:
        drop_database(name)
    gaps = result.gaps
    target = TARGETS[args.fault]
    print(f"{args.fault}: {len(gaps)} faults of the active node, two nodes on PostgreSQL")
    print(
        f"  gap from the fault to the first turn completed on the new leader: "
        f"p50 {statistics.median(gaps):.3f} s  p99 {percentile(gaps, 0.99):.3f} s  "
        f"max {max(gaps):.3f} s"
    )
    ready = result.ready
    print(
        f"  gap from the fault to the standby serving (/readyz 200): "
        f"p50 {statistics.median(ready):.3f} s  p99 {percentile(ready, 0.99):.3f} s"
    )
    verdict = "met" if percentile(gaps, 0.99) <= target else "MISSED"
    print(f"  target p99 <= {target:g} s: {verdict}")
    print(f"  epochs {result.epochs[0]} -> {result.epochs[-1]}, turns after the last fault")
    for problem in result.problems:
        print(f"  PROBLEM: {problem}")
    return 1 if result.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

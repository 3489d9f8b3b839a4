"""How long service stops when the active node fails, with a hot standby on PostgreSQL.

    .venv/bin/python -m bench.takeover [--kills 20] [--fault kill|stop|term]
    .venv/bin/python -m bench.takeover --kills 1000           # the long form

Two ``dex server`` nodes on one fresh PostgreSQL database, one Worker and one client that
know both addresses. The client runs short turns one after another (model -> a ``write``
tool -> model, ``bench/takeover_agents.py``), each sent with a ``message_id`` so a send
repeated across the gap is one message. Each round fails the active node while a write
runs (once the tool's ledger shows a new run: the body works 50 ms after writing it) and
measures the gap: from the fault to the first turn completed after it (on the new
leader). Then the failed node is started again as the standby, and the next round fails
the new leader.

Faults: ``kill`` (SIGKILL: target p99 <= 2 s), ``stop`` (SIGSTOP, a hung leader whose
sockets stay open: the lease times out; target <= 4 s; the paused node is then resumed,
finds its lease lost and leaves), ``term`` (SIGTERM, a planned step-down: the node drains
and releases the lease at once; target <= 1 s).

It checks, and exits 1 if any fails:

- No write ran twice, by the ``write`` tool's own ledger outside Dex: no idempotency key
  is in it twice, every call Dex records ``succeeded`` is in it exactly once (every
  ``outcome_unknown`` at most once), and none that Dex says never ran is in it.
- Every turn sent completed, and no message is in the history twice.
- Each new leader's epoch is higher than the last.
- Exactly one node serves, checked at the moments two could: both nodes up (at the
  start, and after the failed node is back as the standby) and right after each takeover
  (for ``stop``, while the paused leader resumes). For ``WINDOW`` seconds every node's
  ``/readyz`` is polled and exactly one must say ready each time; then a message sent
  straight to each node that said it is not ready must be refused (503, naming a role
  that does not serve), and must never reach the history.
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
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

import dex
from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex.server.ha.node import SERVING
from dex.testing import Ledger, ServerProcess, WorkerProcess, wait_until

AGENTS = str(Path(__file__).with_name("takeover_agents.py"))
ADMIN_URL = os.environ.get("DEX_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGETS = {"kill": 2.0, "stop": 4.0, "term": 1.0}
WINDOW = 0.5
"""Seconds over which every node's ``/readyz`` is polled at a moment two nodes could serve."""
POLL = 0.02
"""Seconds between two polls of the nodes in a window."""


@dataclass
class Result:
    gaps: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)
    """From the fault to the standby answering ``/readyz`` 200."""
    epochs: list[int] = field(default_factory=list)
    turns: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    """The ``write`` calls Dex recorded, by status."""
    runs: int = 0
    """The runs of ``write`` in its ledger."""
    polls: int = 0
    """The polls of every node's ``/readyz`` that found exactly one ready."""
    refusals: list[str] = field(default_factory=list)
    """Messages sent to nodes that did not serve, and refused: never in the history."""
    problems: list[str] = field(default_factory=list)


class Turns(threading.Thread):
    """Runs turns one after another; records when each completed."""

    def __init__(self, address: str, session: str) -> None:
        super().__init__(daemon=True)
        self.address, self.session = address, session
        self.completed: list[float] = []
        self.acknowledged: list[str] = []
        """The messages of every turn that completed, in order: each must stay stored."""
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
                self.acknowledged.append(f"turn {n}")
                self.completed.append(time.time())


def gone(node: ServerProcess) -> bool:
    return not node.alive


def epoch(node: ServerProcess) -> int:
    with urllib.request.urlopen(node.address + "/readyz", timeout=2) as r:
        return int(json.loads(r.read())["epoch"])


def readiness(node: ServerProcess) -> str | None:
    """What the node's ``/readyz`` says: ``ready``, or the role of a node that is not;
    None when it does not answer (dead, or stopped)."""
    try:
        with urllib.request.urlopen(node.address + "/readyz", timeout=2) as r:
            return "ready" if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return str(json.loads(e.read()).get("role", f"HTTP {e.code}"))
    except OSError:
        return None


def send_to(node: ServerProcess, session: str, text: str) -> tuple[int, str]:
    """Send a message to this node only, with no retry: the HTTP status and the role the
    node names (``x-dex-role``), or 0 and why no answer came."""
    request = urllib.request.Request(
        f"{node.address}/v1/sessions/{session}/messages",
        data=json.dumps({"text": text, "message_id": text}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status), r.headers.get("x-dex-role", "")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("x-dex-role", "")
    except OSError as e:
        return 0, repr(e)


def one_serves(nodes: list[ServerProcess], session: str, moment: str, result: Result) -> None:
    """Poll every node's ``/readyz`` for ``WINDOW`` seconds: exactly one must say ready at
    each poll. Then each node that answered not ready must refuse a message sent straight
    to it (503, naming a role that does not serve)."""
    seen: Counter[tuple[str | None, ...]] = Counter()
    deadline = time.monotonic() + WINDOW
    while True:
        seen[tuple(readiness(node) for node in nodes)] += 1
        if time.monotonic() > deadline:
            break
        time.sleep(POLL)
    for said, times in seen.items():
        if said.count("ready") == 1:
            result.polls += times
        else:
            result.problems.append(
                f"{moment}: {said.count('ready')} nodes ready in {times} of "
                f"{sum(seen.values())} polls (the nodes said {said})"
            )
    ((usually, _),) = seen.most_common(1)
    for node, says in zip(nodes, usually, strict=True):
        if says in ("ready", None):
            continue
        text = f"refused {len(result.refusals) + 1}"
        status, role = send_to(node, session, text)
        result.refusals.append(text)
        if status != 503 or role in SERVING or not role:
            result.problems.append(
                f"{moment}: a node that said {says!r} answered a message {status} ({role})"
            )


def ledger_problems(calls: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """Where the ``write`` tool's ledger and Dex's record of its calls disagree: a key
    that ran twice, a run no call of Dex accounts for, a call Dex records ``succeeded``
    that did not run exactly once, or one Dex says never ran that did."""
    times = Counter(run["key"] for run in runs)
    problems = [f"the write of key {key} ran {n} times" for key, n in times.items() if n > 1]
    keys = {call["idempotency_key"] for call in calls}
    problems += [
        f"a write of key {key} ran, and Dex has no such call" for key in times if key not in keys
    ]
    for call in calls:
        ran = times[call["idempotency_key"]]
        what = f"call {call['id']} (turn {call['turn']}) is {call['status']}"
        if call["status"] == "succeeded" and ran != 1:
            problems.append(f"{what}, yet the ledger holds {ran} runs of it")
        not_run = (call["error"] or "").startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
        if call["status"] == "failed" and not_run and ran:
            problems.append(f"{what} as never run, yet the ledger holds {ran} runs of it")
    return problems


def runs_so_far(ledger: Ledger) -> int:
    """How many runs of ``write`` the ledger holds: its lines (cheaper than reading them)."""
    return ledger.path.read_bytes().count(b"\n") if ledger.path.exists() else 0


def runs_beyond(ledger: Ledger, count: int) -> bool:
    """Whether a run of ``write`` began since the ledger held ``count``."""
    return runs_so_far(ledger) > count


def held_against(snapshot: dict[str, Any], ledger: Ledger, result: Result) -> None:
    """The session as Dex recorded it, held against the ``write`` tool's ledger and the
    messages that nodes which did not serve refused."""
    users = Counter(item["text"] for item in snapshot["history"] if item["type"] == "user")
    result.problems += [
        f"{text!r} is in the history {n} times" for text, n in users.items() if n > 1
    ]
    result.problems += [
        f"{text!r}, refused, is in the history" for text in result.refusals if users[text]
    ]
    runs = ledger.entries("write")
    result.runs = len(runs)
    result.writes = Counter(call["status"] for call in snapshot["tool_calls"])
    result.problems += ledger_problems(snapshot["tool_calls"], runs)


def start_two_nodes(
    directory: Path, database: str, ledger: Ledger
) -> tuple[list[ServerProcess], WorkerProcess]:
    """Two ``--standby`` nodes on ``database``, the first serving and the second its
    standby, and a Worker that knows both, whose ``write`` keeps ``ledger``."""
    nodes = [
        ServerProcess(directory / name, heartbeat_timeout=5.0, database=database, standby=True)
        for name in ("a", "b")
    ]
    address = ",".join(n.address for n in nodes)
    nodes[0].start()
    nodes[1].start(ready=False)
    worker = WorkerProcess(
        AGENTS, address, directory / "worker.log", env={"DEX_TAKEOVER_LEDGER": str(ledger.path)}
    ).start()
    return nodes, worker


def run(kills: int, fault: str, directory: Path, database: str) -> Result:
    result = Result()
    ledger = Ledger(directory / "ledger.jsonl")
    nodes, worker = start_two_nodes(directory, database, ledger)
    address = ",".join(n.address for n in nodes)
    active, standby = nodes
    try:
        with dex.SyncClient(address, timeout=60) as client:
            wait_until(lambda: client.list_agents(), 30, what="the Worker registered")
            session = client.create_session("takeover")["id"]
        one_serves(nodes, session, "both nodes up", result)
        turns = Turns(address, session)
        turns.start()
        result.epochs.append(epoch(active))
        for round_ in range(1, kills + 1):
            wait_until(lambda: len(turns.completed) >= 2, 30, what="turns run")
            running = partial(runs_beyond, ledger, runs_so_far(ledger))
            wait_until(running, 30, 0.002, what="a write running")
            failed_at = time.time()
            assert active.proc is not None
            if fault == "kill":
                active.kill()
            elif fault == "stop":
                active.proc.send_signal(signal.SIGSTOP)
            else:
                active.proc.send_signal(signal.SIGTERM)
            wait_until(standby.ready, 30, 0.01, what="the standby took over")
            result.ready.append(time.time() - failed_at)
            first = wait_until(partial(turns.after, failed_at), 30, 0.005, "a turn done")
            result.gaps.append(first[0] - failed_at)
            result.epochs.append(epoch(standby))
            if fault == "stop":
                active.proc.send_signal(signal.SIGCONT)  # it finds its lease lost and exits
            one_serves(nodes, session, f"round {round_}, after the takeover", result)
            if fault == "stop":
                wait_until(partial(gone, active), 30, what="the paused node left")
            active.kill()
            active.start(ready=False)
            one_serves(nodes, session, f"round {round_}, the failed node back", result)
            active, standby = standby, active
            turns.completed.clear()
        turns.stop.set()
        turns.join(90)
        result.turns = len(turns.completed)
        result.problems += turns.errors
        with dex.SyncClient(address, timeout=60) as client:
            held_against(client.get_agent_snapshot(session), ledger, result)
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
    epochs = f"{result.epochs[0]} -> {result.epochs[-1]}"
    print(f"  epochs {epochs}, {result.turns} turns after the last fault")
    writes = ", ".join(f"{n} {status}" for status, n in sorted(result.writes.items()))
    print(f"  write calls: {writes}; {result.runs} runs in the tool's ledger")
    print(
        f"  one node ready in {result.polls} polls of both nodes' /readyz; "
        f"{len(result.refusals)} messages sent to the other refused"
    )
    for problem in result.problems:
        print(f"  PROBLEM: {problem}")
    return 1 if result.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

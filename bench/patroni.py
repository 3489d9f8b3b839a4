"""Dex across a PostgreSQL failover: the PostgreSQL primary dies under load, Patroni
promotes the synchronous standby, and Dex serves again with nothing acknowledged lost.

    .venv/bin/python -m bench.patroni [--kills 10] [--fault kill|crash|stop]

``scripts/patroni`` brings up, from Debian's packages, etcd, two PostgreSQL servers run by
Patroni with synchronous replication, and HAProxy routing to the primary
(docs/high-availability.md, "PostgreSQL that fails over"), on free ports of 127.0.0.1 in
a directory of its own. Two ``dex server`` nodes (``--standby``) reach the database only
through HAProxy; one Worker and one client know both nodes. The client runs turns one
after another (model -> a single-attempt ``write`` tool -> model,
``bench/takeover_agents.py``), each sent with a ``message_id``.

Each round waits until the cluster has a primary and a synchronous standby, then for a
write to start running (its ledger line), and fails the primary (``FAULTS``): ``kill``
SIGKILLs its postmaster, and Patroni (``primary_start_timeout: 0``) gives the leader key up
at once; ``crash`` SIGKILLs its Patroni too, as when the machine dies, so the key expires
after Patroni's ``ttl``; ``stop`` SIGTERMs its Patroni, which stops PostgreSQL and hands
over. The standby is promoted, HAProxy sends new connections to it and closes those to
the dead server; the failed server comes back as the new standby (``pg_rewind``; its
Patroni started again after ``crash`` and ``stop``). Every Dex node loses its lease connection and
exits with status 4; the supervisor here starts it again, as systemd would, and it joins
as a standby: one node takes every partition and serves.

It measures, from the fault: HAProxy reaching the promoted primary, a Dex node serving
with a higher epoch, and the gap (``stall``: the longest time without a turn completing,
until a turn completes on the new primary). It checks, and exits 1 if any
fails: every turn the client saw complete has its message in the history (0 acknowledged
writes lost), no message is there twice, every turn sent completed, and the ``write``
tool's own ledger agrees with Dex (``bench.takeover.held_against``: no key ran twice,
every ``succeeded`` call ran exactly once; a write the fault interrupted may be
``outcome_unknown``, having run at most once).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

import dex
from bench.takeover import (
    Result,
    Turns,
    epoch,
    held_against,
    percentile,
    runs_beyond,
    runs_so_far,
    start_two_nodes,
)
from dex.testing import Ledger, ServerProcess, free_port, wait_until

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "patroni"
MEMBERS = ("pg1", "pg2")
HEALTHY_WAIT = 120.0
"""Seconds a round waits for a primary with a synchronous standby (the killed server
rejoins as the standby: a rewind and a restart)."""
FAILOVER_WAIT = 90.0
"""Seconds a round waits for each step of the failover."""
FAULTS = {
    "kill": "SIGKILL of the primary's postmaster (its Patroni hands the leader key over)",
    "crash": "SIGKILL of the primary's Patroni and postmaster, as when its machine dies "
    "(the leader key expires after Patroni's ttl)",
    "stop": "SIGTERM of the primary's Patroni (it stops PostgreSQL, then hands over)",
}


class Patroni:
    """The cluster of ``scripts/patroni``, on ports of its own: ``start`` (the URL of
    HAProxy's database ``postgres``), the members' roles, a kill of the primary, ``stop``
    (which removes its directory). The directory is a new one under the system's temporary
    directory, where the user postgres, which runs PostgreSQL, can reach it."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="dex-patroni-"))
        # etcd, etcd peer, PostgreSQL x2, Patroni REST x2, HAProxy, HAProxy stats
        self.ports = [free_port() for _ in range(8)]
        self.api = dict(zip(MEMBERS, self.ports[4:6], strict=True))
        self.url = ""

    def _script(self, action: str, *names: str) -> str:
        env = {**os.environ, "DEX_PATRONI_PORTS": " ".join(map(str, self.ports))}
        done = subprocess.run(
            ["bash", str(SCRIPT), action, *names, str(self.directory)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/patroni {action} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> str:
        self.url = self._script("start")
        return self.url

    def stop(self) -> None:
        self._script("stop")

    def database(self, name: str) -> str:
        """A new database on the cluster (through HAProxy): its URL."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + "/" + name

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster``), from any member that answers."""
        for port in self.api.values():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=2) as r:
                    return list(json.loads(r.read())["members"])
            except OSError:
                continue
        return []

    def leader(self) -> str | None:
        return next((m["name"] for m in self.members() if m["role"] == "leader"), None)

    def healthy(self) -> bool:
        """A primary and a synchronous standby, streaming on its timeline with no lag: a
        commit now waits for the standby, which may be promoted."""
        roles = {m["role"]: m for m in self.members() if m["state"] in ("running", "streaming")}
        leader, standby = roles.get("leader"), roles.get("sync_standby")
        return (
            leader is not None
            and standby is not None
            and standby.get("lag") == 0
            and standby.get("timeline") == leader.get("timeline")
        )

    def serving(self) -> str | None:
        """The member HAProxy sends a new connection to, if it is a primary."""
        try:
            with psycopg.connect(self.url, connect_timeout=1, autocommit=True) as conn:
                row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return None
        assert row is not None
        if row[1]:
            return None
        return MEMBERS[self.ports[2:4].index(row[0])]

    def _pid(self, name: str, postmaster: bool) -> int:
        path = self.directory / (f"{name}/data/postmaster.pid" if postmaster else f"{name}.pid")
        return int(path.read_text().split()[0])

    def fail_primary(self, fault: str) -> str:
        """Fail the primary (``FAULTS``): the primary's name."""
        name = self.leader()
        assert name is not None, "no primary to fail"
        postmaster, patroni = self._pid(name, True), self._pid(name, False)
        if fault == "stop":
            os.kill(patroni, signal.SIGTERM)
            return name
        if fault == "crash":
            os.kill(patroni, signal.SIGKILL)
        os.kill(postmaster, signal.SIGKILL)
        return name

    def patroni_runs(self, name: str) -> bool:
        try:
            os.kill(self._pid(name, False), 0)
        except ProcessLookupError:
            return False
        return True

    def rejoin(self, name: str) -> None:
        """Start the member's Patroni again once it has exited: it rejoins as a standby."""
        wait_until(lambda: not self.patroni_runs(name), 60, 0.05, f"{name}'s Patroni exits")
        self._script("rejoin", name)


class Supervisor(threading.Thread):
    """Starts again, as a standby, every node that exits (a node that lost its lease exits
    with status 4; one that could not reach the database at start, with 3): what systemd's
    ``Restart=always`` does."""

    def __init__(self, nodes: list[ServerProcess]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.exits: Counter[int] = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for node in self.nodes:
                with self.lock:
                    if self.stop.is_set() or node.proc is None or node.alive:
                        continue
                    self.exits[node.proc.returncode] += 1
                    try:
                        node.start(ready=False)
                    except (RuntimeError, TimeoutError):
                        pass  # it exited again: the next look starts it again

    def halt(self) -> None:
        with self.lock:
            self.stop.set()
        self.join(60)


@dataclass
class Failovers(Result):
    promoted: list[float] = field(default_factory=list)
    """From the kill to HAProxy sending a new connection to the promoted primary."""
    exits: Counter[int] = field(default_factory=Counter)
    """Dex nodes' exits, by status (4: stepped down; 3: the database was unreachable)."""
    lost: list[str] = field(default_factory=list)
    """Messages of turns the client saw complete that are not in the history."""
    duplicated: int = 0
    """Keys of ``write`` that ran more than once, by its ledger."""


def stall(failed_at: float, ready_at: float, completed: list[float]) -> float:
    """The gap: the longest time without a turn completing, from the fault to the first
    turn completed after a node was seen serving on the new primary (a turn may complete
    just after the fault, before PostgreSQL stops)."""
    first_after = min(t for t in completed if t > ready_at)
    moments = [failed_at, *sorted(t for t in completed if failed_at < t <= first_after)]
    return max(b - a for a, b in itertools.pairwise(moments))


def promoted(cluster: Patroni, old: str) -> bool:
    """Whether HAProxy sends a new connection to a primary other than ``old``."""
    return cluster.serving() not in (None, old)


def serving_epoch(nodes: list[ServerProcess], above: int) -> int | None:
    """The epoch of a node that serves with an epoch above ``above``, if one does."""
    for node in nodes:
        try:
            now = epoch(node)
        except (OSError, ValueError, KeyError):
            continue
        if now > above:
            return now
    return None


def run(kills: int, directory: Path, cluster: Patroni, fault: str = "kill") -> Failovers:
    """``kills`` rounds of a primary's failure (``FAULTS``) under load on a started
    ``cluster``."""
    result = Failovers()
    database = cluster.database("dex")
    ledger = Ledger(directory / "ledger.jsonl")
    nodes, worker = start_two_nodes(directory, database, ledger)
    address = ",".join(n.address for n in nodes)
    supervisor = Supervisor(nodes)
    supervisor.start()
    turns: Turns | None = None
    try:
        with dex.SyncClient(address, timeout=60) as client:
            wait_until(lambda: client.list_agents(), 30, what="the Worker registered")
            session = client.create_session("takeover")["id"]
        turns = Turns(address, session)
        turns.start()
        result.epochs.append(epoch(nodes[0]))
        for _ in range(kills):
            wait_until(cluster.healthy, HEALTHY_WAIT, 0.1, "a primary with a sync standby")
            wait_until(lambda: len(turns.completed) >= 2, FAILOVER_WAIT, what="turns run")
            running = partial(runs_beyond, ledger, runs_so_far(ledger))
            wait_until(running, 30, 0.002, what="a write running")
            killed_at = time.time()
            old = cluster.fail_primary(fault)
            wait_until(
                partial(promoted, cluster, old),
                FAILOVER_WAIT,
                0.02,
                "HAProxy reaches the promoted primary",
            )
            result.promoted.append(time.time() - killed_at)
            new_epoch = wait_until(
                partial(serving_epoch, nodes, result.epochs[-1]),
                FAILOVER_WAIT,
                0.02,
                "a Dex node serves with a higher epoch",
            )
            ready_at = time.time()
            result.ready.append(ready_at - killed_at)
            assert new_epoch is not None
            result.epochs.append(new_epoch)
            wait_until(partial(turns.after, ready_at), FAILOVER_WAIT, 0.005, "a turn completed")
            result.gaps.append(stall(killed_at, ready_at, turns.completed))
            turns.completed.clear()
            if fault != "kill":  # no Patroni runs there any more: start it again
                cluster.rejoin(old)
        turns.stop.set()
        turns.join(90)
        result.turns = len(turns.acknowledged)
        result.problems += turns.errors
        with dex.SyncClient(address, timeout=60) as client:
            snapshot = client.get_agent_snapshot(session)
        held_against(snapshot, ledger, result)
        stored = {item["text"] for item in snapshot["history"] if item["type"] == "user"}
        result.lost = [text for text in turns.acknowledged if text not in stored]
        result.problems += [f"{text!r} was acknowledged and is lost" for text in result.lost]
        keys = Counter(run["key"] for run in ledger.entries("write"))
        result.duplicated = sum(1 for n in keys.values() if n > 1)
        if result.epochs != sorted(set(result.epochs)):
            result.problems.append(f"epochs did not rise: {result.epochs}")
    finally:
        if turns is not None:
            turns.stop.set()
        supervisor.halt()
        result.exits = supervisor.exits
        worker.kill()
        for node in nodes:
            node.kill()
    return result


def report(kills: int, fault: str, result: Failovers) -> list[str]:
    def spread(values: list[float]) -> str:
        return (
            f"p50 {statistics.median(values):.2f} s  p99 {percentile(values, 0.99):.2f} s  "
            f"max {max(values):.2f} s"
        )

    writes = ", ".join(f"{n} {status}" for status, n in sorted(result.writes.items()))
    exits = ", ".join(f"{n} with status {code}" for code, n in sorted(result.exits.items()))
    lines = [
        f"{kills} x {FAULTS[fault]}; Patroni, synchronous replication, HAProxy",
        f"  HAProxy reaching the promoted primary: {spread(result.promoted)}",
        f"  a Dex node serving again (higher epoch): {spread(result.ready)}",
        f"  gap, the longest time without a turn completing: {spread(result.gaps)}",
        f"  {result.turns} turns acknowledged, {len(result.lost)} lost; epochs "
        f"{result.epochs[0]} -> {result.epochs[-1]}",
        f"  write calls: {writes}; {result.runs} runs in the tool's ledger, "
        f"{result.duplicated} keys run twice",
        f"  Dex nodes exited {exits or 'never'} (restarted by the supervisor)",
    ]
    return lines + [f"  PROBLEM: {problem}" for problem in result.problems]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--fault", choices=sorted(FAULTS), default="kill")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dex-patroni-") as tmp:
        cluster = Patroni()
        try:
            cluster.start()
            result = run(args.kills, Path(tmp), cluster, args.fault)
        finally:
            cluster.stop()
    print("\n".join(report(args.kills, args.fault, result)))
    return 1 if result.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

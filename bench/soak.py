"""A chaos soak with an invariant checker, on one embedded (SQLite) node.

    .venv/bin/python -m bench.soak                          # 50 sessions, 120 s of chaos
    .venv/bin/python -m bench.soak --seconds 30 --worker-kill-every 0.5 --server-kill-every 3

N sessions (``--sessions``) each send turns that call the tools of
``bench/soak_agents.py``: ``read``, ``idempotent_write``, ``write`` (single attempt),
``write`` needing approval, ``task`` (start and polls) and a durable timer. Every send
carries a message id and is sent again with it until the node acknowledges it; the soak
keeps a record of every acknowledged send. A client task approves or denies every tool
call waiting for approval (a fixed share is denied). Meanwhile ``bench.soak_chaos`` runs
the faults: SIGKILL a Worker and start another, SIGKILL the node and start it again on
its data directory, SIGSTOP/SIGCONT a Worker or the node for less and for more than the
heartbeat timeout, cut or stall every Worker connection at a TCP proxy. Chaos stops
after ``--seconds`` or ``--max-kills`` SIGKILLs, whichever comes first.

Then the sessions finish their turns, and every session must be idle within
``--settle-seconds`` (60 s). ``bench.soak_check`` then checks the invariants against the
tools' ledger, the clients' record and the node's snapshots and turn records, and the
soak prints kills by kind, turns, tool calls by tool and status, and violations by kind.
Exit status 1 on any violation. ``--report FILE`` also writes the figures as JSON, and
``--keep DIR`` keeps the data directory, ledger and logs for a post-mortem.

``--postgres`` runs a leader and a hot standby on a private PostgreSQL
(``bench.soak_postgres``). ``--cluster 3`` runs three nodes without ``--standby`` there
(``bench.soak_cluster``): each session's client tries the nodes in another order, so calls
arrive at nodes that forward them; the chaos SIGKILLs, pauses and SIGTERMs nodes and a
spare node joins for a while; at the end every partition must be owned by exactly one
live node (``partition_owner``), and the report adds how often partitions moved, how long
they went without a live owner, and the turns' times.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dex
from bench.soak_chaos import KILLS, Chaos, Cluster, SoakCluster, faults
from bench.soak_check import Evidence, Findings, Send, check, unheld
from bench.soak_cluster import NodeCluster, cluster_faults, settle_ownership
from bench.soak_postgres import HaCluster, PrivatePostgres
from dex.errors import Conflict, DexError
from dex.testing import Ledger, wait_until_async

# Tool, weight, how long its body (or task, or timer) takes in ms: (low, high).
MENU: list[tuple[str, int, tuple[int, int]]] = [
    ("lookup", 3, (0, 300)),
    ("upsert", 3, (0, 300)),
    ("charge", 3, (0, 300)),
    ("transfer", 2, (0, 300)),
    ("render", 2, (100, 1500)),
    ("nap", 2, (100, 2000)),
]
OWNERSHIP_SETTLE = 30.0
"""With --cluster: seconds after the sessions settled for every partition to be owned by
exactly one live node (a node restarted late may still be taking its share)."""
DENY_ONE_IN = 4
"""The approving client denies one approval in this many (chosen by the call's tag)."""


HELP = {
    "sessions": "sessions sending turns at once",
    "workers": "Worker processes (a killed one is replaced at once)",
    "seconds": "chaos stops after this long",
    "max_kills": "... or after this many SIGKILLs (Workers and node), whichever comes first",
    "worker_kill_every": "seconds between two Worker SIGKILLs, on average (0: never)",
    "server_kill_every": "seconds between two node SIGKILLs and restarts, on average (0: never)",
    "pause_every": "seconds between two SIGSTOP/SIGCONT pauses of a Worker or the node (0: never)",
    "cut_every": "seconds between two cuts or stalls of the Worker connections (0: never)",
    "heartbeat_timeout": "the node's --heartbeat-timeout; pauses last 0.3x or 1.5x+0.5 s of it",
    "reconnect_grace": "the node's --reconnect-grace",
    "settle_seconds": "after the chaos, every session must be idle within this long",
    "seed": "seed of the random choices (tools, timings, victims)",
    "database": "run two nodes (a leader and a hot standby) on this PostgreSQL database; "
    "the node fault SIGKILLs the leader (never restarts that PostgreSQL)",
    "postgres": "run two nodes on a private PostgreSQL server of the soak's own (initdb in "
    "a temporary directory, a free port), which the chaos also restarts",
    "postgres_restart_every": "with --postgres: seconds between two PostgreSQL restarts "
    "(a fast shutdown and a start), on average (0: never)",
    "cluster": "run this many nodes without --standby (a cluster sharing 64 partitions) on "
    "a private PostgreSQL; the node faults SIGKILL, SIGSTOP (0.5 to 5 s) and SIGTERM a "
    "node, and a spare node joins for a while (bench/soak_cluster.py); no cuts, no "
    "PostgreSQL restarts",
    "disk_full_every": "on SQLite (neither --postgres, --database nor --cluster): seconds "
    "between two spells of a full disk (every commit fails with SQLite's SQLITE_FULL, "
    "through the node's sqlite.commit failpoint) of 0.5 to 3 s, on average (0: never)",
    "database_cut_every": "with --postgres or --database: seconds between two network cuts "
    "between the leader and PostgreSQL (silence, nothing closed) held until it steps "
    "down, on average (0: never)",
    "leave_every": "with --cluster: seconds between two nodes leaving on purpose (SIGTERM, "
    "started again a few seconds later), on average (0: never)",
    "join_every": "with --cluster: seconds between two joins of the spare node (it leaves "
    "again 5 to 15 s later), on average (0: never)",
}


@dataclass(frozen=True)
class SoakConfig:
    sessions: int = 50
    workers: int = 3
    seconds: float = 120.0
    max_kills: int = 1_000_000
    worker_kill_every: float = 2.0
    server_kill_every: float = 10.0
    pause_every: float = 5.0
    cut_every: float = 5.0
    heartbeat_timeout: float = 2.0
    reconnect_grace: float = 1.0
    settle_seconds: float = 60.0
    seed: int = 1
    database: str = ""
    postgres: bool = False
    postgres_restart_every: float = 30.0
    disk_full_every: float = 0.0
    database_cut_every: float = 0.0
    cluster: int = 0
    leave_every: float = 20.0
    join_every: float = 25.0


@dataclass
class Traffic:
    """The clients: sessions sending turns, and the approver."""

    client: dex.Client
    rng: random.Random
    sends: list[Send] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)
    awaiting_approval: dict[str, str] = field(default_factory=dict)
    """Tag: session, for ``transfer`` calls the approver has not decided yet."""
    errors: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    """Client calls that failed with something other than a ``DexError``."""
    clients: list[dex.Client] = field(default_factory=list)
    """With several, session ``i`` sends through ``clients[i % len]`` (on a cluster, each
    tries the nodes in another order: calls arrive at every node and are forwarded)."""
    turn_seconds: list[float] = field(default_factory=list)
    """From each send's acknowledgement to the end of its turn."""

    async def session(self, index: int, session_id: str, stop: asyncio.Event) -> None:
        client = self.clients[index % len(self.clients)] if self.clients else self.client
        number = 0
        while not stop.is_set():
            number += 1
            send = self._plan(index, number, session_id)
            self.sends.append(send)
            send.turn = await self._send(client, send)
            acknowledged = time.monotonic()
            await self._wait_turn(client, session_id, send.turn)
            self.turn_seconds.append(time.monotonic() - acknowledged)

    def _plan(self, index: int, number: int, session_id: str) -> Send:
        tools = [name for name, weight, _ in MENU for _ in range(weight)]
        spans = {name: span for name, _, span in MENU}
        message_id = f"s{index}-m{number}"
        calls: list[tuple[str, dict[str, Any]]] = []
        for i in range(self.rng.randint(1, 3)):
            name = self.rng.choice(tools)
            calls.append(
                (name, {"tag": f"{message_id}-c{i}", "ms": self.rng.randint(*spans[name])})
            )
        text = f"{message_id} call: {json.dumps([list(c) for c in calls])}"
        tags = {args["tag"]: name for name, args in calls}
        for tag, name in tags.items():
            if name == "transfer":
                self.awaiting_approval[tag] = session_id
        return Send(session_id, message_id, text, tags)

    async def _send(self, client: dex.Client, send: Send) -> int:
        """Send until acknowledged: the message id makes sending again safe."""
        while True:
            try:
                result = await client.send_message(
                    send.session, send.text, message_id=send.message_id
                )
                turn: int = result["turn"]
                return turn
            except Exception as e:
                self.note(f"send {send.message_id}", e)
                await asyncio.sleep(0.2)

    async def _wait_turn(self, client: dex.Client, session_id: str, turn: int) -> None:
        while True:
            try:
                result = await client.wait_turn(session_id, turn, timeout=30)
                if result["status"] not in ("running", "waiting"):  # the approver approves
                    return
            except Exception as e:
                self.note(f"wait {session_id} turn {turn}", e)
                await asyncio.sleep(0.2)

    async def approver(self) -> None:
        """Approve or deny every waiting ``transfer`` call, forever (cancel it). Each
        session is looked at apart, so a call held up by one session's node (paused, say)
        holds up no other session's approvals."""
        looking: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for session_id in sorted(set(self.awaiting_approval.values())):
                    if session_id not in looking or looking[session_id].done():
                        looking[session_id] = asyncio.create_task(self._approve(session_id))
                await asyncio.sleep(0.2)
        finally:
            for task in looking.values():
                task.cancel()
            await asyncio.gather(*looking.values(), return_exceptions=True)

    async def _approve(self, session_id: str) -> None:
        try:
            waiting = await self.client.list_approvals(session_id)
        except Exception as e:
            self.note(f"approvals of {session_id}", e)
            return
        for approval in waiting:
            await self._decide(session_id, approval)

    async def _decide(self, session_id: str, approval: dict[str, Any]) -> None:
        tag = approval["arguments"]["tag"]
        decision = self.decisions.setdefault(
            tag, "deny" if zlib.crc32(tag.encode()) % DENY_ONE_IN == 0 else "approve"
        )
        try:
            if decision == "deny":
                await self.client.deny(session_id, approval["call_id"], "denied by the soak")
            else:
                await self.client.approve(
                    session_id, approval["call_id"], arguments_hash=approval["arguments_hash"]
                )
            self.awaiting_approval.pop(tag, None)
        except Conflict:
            self.awaiting_approval.pop(tag, None)  # decided already (a retry of ours)
        except Exception as e:
            self.note(f"{decision} {tag}", e)  # the next round asks again

    def note(self, what: str, error: Exception) -> None:
        """A failed client call, to be tried again. The SDK promises ``DexError`` for
        every failure: anything else is a finding of its own (``client_error``)."""
        self.errors.append(f"{what}: {error!r}")
        if not isinstance(error, DexError):
            self.unexpected.append(f"{what}: {error!r}")


@dataclass
class Watch:
    """Snapshots of a few sessions at a time during the chaos. An attempt of a running
    Step that no Worker holds is fine for a moment (a hand-out being committed), but one
    still unheld ``patience`` seconds later has nothing left to fail it (no heartbeat
    deadline, no reconnect grace): a leak, even if a later node restart heals it."""

    client: dex.Client
    rng: random.Random
    session_ids: list[str]
    patience: float
    traffic: Traffic
    confirmed: dict[str, str] = field(default_factory=dict)
    snapshots: int = 0

    async def run(self) -> None:
        first_seen: dict[str, float] = {}
        while True:
            for session_id in self.rng.sample(self.session_ids, min(5, len(self.session_ids))):
                try:
                    snapshot = await self.client.get_agent_snapshot(session_id)
                except Exception as e:
                    self.traffic.note(f"snapshot of {session_id}", e)
                    continue
                self.snapshots += 1
                now = time.monotonic()
                seen = set(unheld(session_id, snapshot))
                for attempt in [a for a in first_seen if a.startswith(session_id + "/")]:
                    if attempt not in seen:
                        del first_seen[attempt]
                for attempt in seen:
                    if now - first_seen.setdefault(attempt, now) > self.patience:
                        self.confirmed[attempt] = session_id
            await asyncio.sleep(0.5)


async def soak(config: SoakConfig, directory: Path, say: Any = print) -> dict[str, Any]:
    """Run the soak in ``directory``; return the report (see ``report``)."""
    # The chaos blocks threads for seconds at a time (a node starting, a leader awaited):
    # enough of them that the default executor's few would queue a fault behind them.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="soak")
    )
    rng = random.Random(config.seed)
    ledger = Ledger(directory / "ledger.jsonl")
    postgres = PrivatePostgres() if config.postgres or config.cluster else None
    cluster: SoakCluster | NodeCluster
    nodes: NodeCluster | None = None
    restart_postgres = None
    if postgres is not None:
        await asyncio.to_thread(postgres.start)
    if config.cluster:
        assert postgres is not None
        cluster = nodes = NodeCluster(
            directory,
            ledger.path,
            config.workers,
            config.heartbeat_timeout,
            config.reconnect_grace,
            database=postgres.url,
            size=config.cluster,
        )
    elif postgres is not None or config.database:
        ha = HaCluster(
            directory,
            ledger.path,
            config.workers,
            config.heartbeat_timeout,
            config.reconnect_grace,
            database=postgres.url if postgres is not None else config.database,
            postgres=postgres,
            database_cuts=config.database_cut_every > 0,
        )
        if postgres is not None and config.postgres_restart_every > 0:
            restart_postgres = ha.restart_postgres
        cluster = ha
    else:
        cluster = Cluster(
            directory,
            ledger.path,
            config.workers,
            config.heartbeat_timeout,
            config.reconnect_grace,
            disk_full=config.disk_full_every > 0,
        )
    started = time.time()
    ownership: list[str] = []
    try:
        await cluster.start()
        async with contextlib.AsyncExitStack() as clients:
            client = await clients.enter_async_context(dex.Client(cluster.address, timeout=30))
            await wait_until_async(
                lambda: _registered(client), 60, 0.1, "the soak agent registered"
            )
            session_ids = [
                (await client.create_session("soak"))["id"] for _ in range(config.sessions)
            ]
            traffic = Traffic(client, random.Random(config.seed + 1))
            if nodes is not None:
                # Each session's calls go first to one node, in turn: every node gets
                # calls about sessions other nodes serve, and forwards them.
                a = nodes.addresses
                traffic.clients = [
                    await clients.enter_async_context(
                        dex.Client(",".join(a[i:] + a[:i]), timeout=30)
                    )
                    for i in range(len(a))
                ]
            chaos = Chaos(
                cluster_faults(
                    nodes,
                    rng,
                    worker_kill_every=config.worker_kill_every,
                    node_kill_every=config.server_kill_every,
                    pause_every=config.pause_every,
                    leave_every=config.leave_every,
                    join_every=config.join_every,
                )
                if nodes is not None
                else faults(
                    cluster,  # type: ignore[arg-type]
                    rng,
                    worker_kill_every=config.worker_kill_every,
                    server_kill_every=config.server_kill_every,
                    pause_every=config.pause_every,
                    cut_every=config.cut_every,
                    postgres_restart_every=config.postgres_restart_every,
                    restart_postgres=restart_postgres,
                    disk_full_every=config.disk_full_every,
                    fill_disk=cluster.fill_disk if isinstance(cluster, Cluster) else None,
                    database_cut_every=config.database_cut_every,
                    cut_database=cluster.cut_database if isinstance(cluster, HaCluster) else None,
                ),
                rng,
                config.seconds,
                config.max_kills,
            )
            approver = asyncio.create_task(traffic.approver())
            watch = Watch(
                client,
                random.Random(config.seed + 2),
                session_ids,
                patience=config.heartbeat_timeout + config.reconnect_grace + 5,
                traffic=traffic,
            )
            watcher = asyncio.create_task(watch.run())
            sessions = [
                asyncio.create_task(traffic.session(i, sid, chaos.stopped))
                for i, sid in enumerate(session_ids)
            ]
            say(
                f"soak: {config.sessions} sessions, {config.workers} Workers, chaos for "
                f"up to {config.seconds:g} s or {config.max_kills} kills, in {directory}"
            )
            await chaos.run()
            chaos_ended = time.monotonic()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            say(
                f"soak: chaos stopped after {time.time() - started:.0f} s: "
                f"{dict(sorted(chaos.counts.items()))}; settling"
            )
            _, late = await asyncio.wait(sessions, timeout=config.settle_seconds)
            for task in late:
                task.cancel()
            for ended in await asyncio.gather(*sessions, return_exceptions=True):
                if isinstance(ended, Exception):
                    raise ended  # a bug of the soak's own: never hide it
            if nodes is not None:
                nodes.restore()
            settle_left = config.settle_seconds - (time.monotonic() - chaos_ended)
            with contextlib.suppress(TimeoutError):
                await wait_until_async(
                    lambda: _all_idle(client, session_ids),
                    max(settle_left, 0.0),
                    0.2,
                    "every session idle",
                )
            settled_in = time.monotonic() - chaos_ended
            if nodes is not None:
                ownership = await settle_ownership(nodes, OWNERSHIP_SETTLE)
            approver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await approver
            evidence = await _evidence(client, session_ids, traffic, ledger)
            evidence.unheld = dict(watch.confirmed)
            evidence.client_errors = list(traffic.unexpected)
    finally:
        await cluster.stop()
        if postgres is not None:
            await asyncio.to_thread(postgres.stop)
    findings = check(evidence)
    for problem in ownership:
        findings.add("partition_owner", "-", problem)
    r = report(config, chaos, findings, traffic, watch, started, settled_in)
    if nodes is not None:
        r.update(_cluster_figures(nodes, traffic))
    if isinstance(cluster, HaCluster):
        takeovers = sorted(cluster.takeovers)
        r["nodes_stepped_down"] = (
            cluster.restarts - r["faults"].get("kill_leader", 0) - len(cluster.cut_step_downs)
        )
        r["takeovers_over_120_s"] = cluster.slow_takeovers
        if takeovers:
            r["takeover_seconds_p50"] = round(takeovers[len(takeovers) // 2], 2)
            r["takeover_seconds_max"] = round(takeovers[-1], 2)
        r["cold_takeovers"] = len(cluster.cold_takeovers)
        if cluster.cold_takeovers:
            r["cold_takeover_seconds_max"] = round(max(cluster.cold_takeovers), 2)
        if config.database_cut_every > 0:
            r["database_cuts"] = {
                "stepped_down_seconds": _spread_of(cluster.cut_step_downs),
                "serving_again_seconds": _spread_of(cluster.cut_takeovers),
                "not_stepped_down": cluster.cuts_not_stepped_down,
            }
    return r


def _spread_of(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        "p50": round(ordered[len(ordered) // 2], 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max": round(ordered[-1], 2),
    }


def _cluster_figures(nodes: NodeCluster, traffic: Traffic) -> dict[str, Any]:
    return {
        "node_restarts": nodes.restarts,
        "nodes_stepped_down": nodes.stepped_down,
        "partition_moves": nodes.moves,
        "partitions_unserved": len(nodes.unserved),
        "unserved_seconds": _spread_of(nodes.unserved),
        "turn_seconds": _spread_of(traffic.turn_seconds),
    }


async def _registered(client: dex.Client) -> bool:
    return any(a["name"] == "soak" for a in await client.list_agents())


async def _all_idle(client: dex.Client, session_ids: list[str]) -> bool:
    for session_id in session_ids:
        snapshot = await client.get_agent_snapshot(session_id)
        if snapshot["session"]["status"] != "idle" or snapshot["current_turn"] is not None:
            return False
    return True


async def _evidence(
    client: dex.Client, session_ids: list[str], traffic: Traffic, ledger: Ledger
) -> Evidence:
    snapshots = {sid: await client.get_agent_snapshot(sid) for sid in session_ids}
    turns: dict[tuple[str, int], dict[str, Any]] = {}
    for send in traffic.sends:
        if send.turn is not None:
            turns[(send.session, send.turn)] = await client.wait_turn(
                send.session, send.turn, timeout=0
            )
    return Evidence(traffic.sends, snapshots, turns, ledger.entries(), dict(traffic.decisions))


def report(
    config: SoakConfig,
    chaos: Chaos,
    findings: Findings,
    traffic: Traffic,
    watch: Watch,
    started: float,
    settled_in: float,
) -> dict[str, Any]:
    by_kind: dict[str, int] = {}
    for v in findings.violations:
        by_kind[v.kind] = by_kind.get(v.kind, 0) + 1
    calls: dict[str, dict[str, int]] = {}
    for (tool, status), n in sorted(findings.calls.items()):
        calls.setdefault(tool, {})[status] = n
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        ),
        "config": dataclasses.asdict(config),
        "seconds": round(time.time() - started, 1),
        "settled_in_seconds": round(settled_in, 1),
        "kills": chaos.kills,
        "faults": dict(sorted(chaos.counts.items())),
        "turns": dict(sorted(findings.turns.items())),
        "tool_calls": sum(findings.calls.values()),
        "tool_calls_by_tool": calls,
        "tool_runs": findings.runs,
        "at_most_once_window": sum(findings.window.values()),
        "at_most_once_window_by_cause": dict(sorted(findings.window.items())),
        "outcome_unknown_by_cause": dict(sorted(findings.unknown.items())),
        "client_retries": len(traffic.errors),
        "snapshots_during_chaos": watch.snapshots,
        "violations": len(findings.violations),
        "violations_by_kind": by_kind,
        "violation_examples": [dataclasses.asdict(v) for v in findings.violations[:30]],
    }


def print_report(r: dict[str, Any], say: Any = print) -> None:
    say(f"\nsoak report ({r['date']}, {r['machine']}; {r['seconds']} s)")
    kills = ", ".join(f"{k} {v}" for k, v in r["faults"].items() if k in KILLS)
    say(f"  kills: {r['kills']} ({kills})")
    others = {k: v for k, v in r["faults"].items() if k not in KILLS}
    say(f"  other faults: {', '.join(f'{k} {v}' for k, v in others.items()) or 'none'}")
    turns = ", ".join(f"{k} {v}" for k, v in r["turns"].items())
    say(f"  turns: {sum(r['turns'].values())} ({turns})")
    say(f"  tool calls: {r['tool_calls']}, tool bodies started: {r['tool_runs']}")
    for tool, statuses in r["tool_calls_by_tool"].items():
        say(f"    {tool:9} {', '.join(f'{s} {n}' for s, n in statuses.items())}")
    causes = ", ".join(f"{k} {v}" for k, v in r["at_most_once_window_by_cause"].items())
    say(
        "  at-most-once window (write outcome_unknown, body completed): "
        f"{r['at_most_once_window']} ({causes or 'none'})"
    )
    unknown = r.get("outcome_unknown_by_cause", {})
    say(
        f"  write outcome_unknown, all: {sum(unknown.values())} "
        f"({', '.join(f'{k} {v}' for k, v in unknown.items()) or 'none'})"
    )
    say(
        f"  settled {r['settled_in_seconds']} s after the chaos stopped; "
        f"client calls retried: {r['client_retries']}; "
        f"snapshots checked during the chaos: {r['snapshots_during_chaos']}"
    )
    if "partition_moves" in r:
        say(
            f"  cluster: node starts after the first {r['node_restarts']} (after kills, "
            f"leaves, step-downs, and joins); nodes that stepped down by themselves "
            f"{r['nodes_stepped_down']}; partitions changed owner "
            f"{r['partition_moves']} times; a partition without a live owner "
            f"{r['partitions_unserved']} times, for {_spread(r['unserved_seconds'])}"
        )
        say(f"  turn time (acknowledged to ended): {_spread(r['turn_seconds'])}")
    elif "nodes_stepped_down" in r:
        say(
            f"  takeovers after a leader's SIGKILL, the standby up: "
            f"p50 {r.get('takeover_seconds_p50')} s, max {r.get('takeover_seconds_max')} s; "
            f"with the standby still starting: {r['cold_takeovers']} "
            f"(max {r.get('cold_takeover_seconds_max')} s); nodes that stepped down by "
            f"themselves (lease lost) and were started again: {r['nodes_stepped_down']}"
        )
        if "database_cuts" in r:
            cuts = r["database_cuts"]
            say(
                f"  leaders cut off from PostgreSQL: stepped down in "
                f"{_spread(cuts['stepped_down_seconds'])}; a node serving again "
                f"{_spread(cuts['serving_again_seconds'])}; did not step down: "
                f"{cuts['not_stepped_down'] or 'none'}"
            )
    say(f"  violations: {r['violations']}")
    for kind, n in r["violations_by_kind"].items():
        say(f"    {kind}: {n}")
    for v in r["violation_examples"]:
        say(f"    - {v['kind']} {v['session']}: {v['what'][:400]}")


def _spread(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v} s" for k, v in figures.items()) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    defaults = SoakConfig()
    for f in dataclasses.fields(SoakConfig):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(
                "--" + f.name.replace("_", "-"), action="store_true", help=HELP[f.name]
            )
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{HELP[f.name]} (default: {default!r})",
        )
    parser.add_argument("--report", type=Path, help="Also write the report as JSON here.")
    parser.add_argument("--keep", type=Path, help="Run in this directory and keep it.")
    args = parser.parse_args(argv)
    config = SoakConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(SoakConfig)})
    if config.disk_full_every > 0 and (config.postgres or config.database or config.cluster):
        parser.error(
            "--disk-full-every fills a SQLite node's disk: not with --postgres, "
            "--database or --cluster"
        )
    if config.database_cut_every > 0 and (
        config.cluster or not (config.postgres or config.database)
    ):
        parser.error(
            "--database-cut-every cuts a leader off from PostgreSQL: it needs "
            "--postgres or --database (and not --cluster)"
        )
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        directory = args.keep
    else:
        directory = Path(tempfile.mkdtemp(prefix="dex-soak-"))
    r = asyncio.run(soak(config, directory))
    print_report(r)
    if r["violations"] and not args.keep:
        print(f"  kept {directory} (data, ledger.jsonl, logs) for a post-mortem")
    elif not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    if args.report:
        args.report.write_text(json.dumps(r, indent=2) + "\n")
    return 1 if r["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())

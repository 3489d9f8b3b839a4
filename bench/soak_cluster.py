"""The soak on a cluster (``python -m bench.soak --cluster 3``): three nodes without
``--standby`` on one private PostgreSQL share its 64 partitions, and the chaos works on
the nodes themselves.

``NodeCluster`` runs the nodes (and a spare one that joins for a while), the Workers
(given the three nodes' addresses; each learns the others from the nodes and connects to
every one), and the supervisor: a node that exits while it is wanted (SIGKILLed, or it
lost its lease while paused and stepped down) is started again after a random short
delay, a non-standby node again, so it rejoins and partitions move back to it by
hand-over. It also watches ``dex_partitions`` and the live nodes in PostgreSQL: how often
a partition changed owner (``moves``), and how long each partition went without a live
owner (``unserved``).

The faults (``cluster_faults``): SIGKILL a node; SIGSTOP a node for 0.5 to 5 s, then
SIGCONT; SIGKILL a Worker (another starts); a node leaves on purpose (SIGTERM: it drains,
hands its partitions over and exits; started again a few seconds later); the spare node
joins (it takes its share), and leaves again (SIGTERM) 5 to 15 s later.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.soak_chaos import Fault, WorkerPool, pause
from dex.server.ha.lease import HELD, LIVE_NODES
from dex.server.store.partitions import DEFAULT_PARTITIONS
from dex.testing import ServerProcess, WorkerProcess

RESTART_DELAY = (0.5, 3.0)
"""Seconds the supervisor waits before it starts a node that died again."""
PAUSE = (0.5, 5.0)
"""Seconds a node stays SIGSTOPped."""
AWAY = (3.0, 8.0)
"""Seconds a node that left on purpose stays away."""
JOINED = (5.0, 15.0)
"""Seconds the spare node stays in the cluster once it joined."""
WATCH = 0.25
"""Seconds between two looks at the partitions' owners."""
LEAVE_WAIT = 60.0
"""Seconds a leaving node has to drain and exit before it is SIGKILLed."""


@dataclass
class NodeCluster(WorkerPool):
    """``size`` nodes and a spare on one PostgreSQL database, Workers connected to every
    node, and the supervisor that starts a wanted node again when it exits."""

    directory: Path
    ledger: Path
    workers_wanted: int
    heartbeat_timeout: float
    reconnect_grace: float
    database: str
    size: int = 3
    nodes: list[ServerProcess] = field(init=False)
    wanted: list[bool] = field(init=False)
    workers: list[WorkerProcess] = field(default_factory=list)
    started_workers: int = 0
    restarts: int = 0
    """Nodes the supervisor started after the first start: after a SIGKILL, a step-down
    or a leave, and the spare's joins."""
    stepped_down: int = 0
    """Nodes that exited by themselves (no SIGKILL, no SIGTERM): a paused node's lease."""
    moves: int = 0
    """Times a partition's owner (``dex_partitions.owner``) changed."""
    unserved: list[float] = field(default_factory=list)
    """Seconds a partition went without a live owner, once per time it did."""
    watch_errors: int = 0
    _due: dict[int, float] = field(default_factory=dict)
    """Node index: when the supervisor starts it again."""
    _signalled: set[int] = field(default_factory=set)
    """Nodes that died of the chaos's SIGKILL or SIGTERM (not of their own accord)."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        env = {"DEX_RECONNECT_GRACE": str(self.reconnect_grace)}
        self.nodes = [
            ServerProcess(
                self.directory / f"node-{i}",
                heartbeat_timeout=self.heartbeat_timeout,
                env=env,
                database=self.database,
            )
            for i in range(self.size + 1)  # the last is the spare that joins
        ]
        self.wanted = [True] * self.size + [False]

    @property
    def addresses(self) -> list[str]:
        """The addresses of the nodes the cluster starts with (not the spare)."""
        return [node.address for node in self.nodes[: self.size]]

    @property
    def address(self) -> str:
        return ",".join(self.addresses)

    @property
    def worker_address(self) -> str:
        return self.address

    @property
    def spare(self) -> int:
        return self.size

    async def start(self) -> None:
        for node in self.nodes[: self.size]:
            await asyncio.to_thread(node.start, ready=False, timeout=60)
        for _ in range(self.workers_wanted):
            self.start_worker()
        self._tasks = [
            asyncio.create_task(self._supervise()),
            asyncio.create_task(self._watch()),
        ]

    def alive(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.alive]

    # --- the faults --------------------------------------------------------------------

    async def kill_node(self, rng: random.Random) -> str:
        """SIGKILL a node (while at least one other runs); the supervisor restarts it. A
        node leaving on purpose (draining after its SIGTERM) may be the victim too:
        ``kill_node_leaving``, and it comes back when its leave ends."""
        alive = self.alive()
        if len(alive) < 2:
            return "kill_node_skipped"
        victim = rng.choice(alive)
        proc = self.nodes[victim].proc
        assert proc is not None
        self._signalled.add(victim)
        proc.send_signal(signal.SIGKILL)
        return "kill_node" if self.wanted[victim] else "kill_node_leaving"

    async def pause_node(self, rng: random.Random) -> str:
        """SIGSTOP a node for 0.5 to 5 s (past ~2 s it loses its lease and exits)."""
        alive = self.alive()
        if not alive:
            return "pause_node_skipped"
        seconds = rng.uniform(*PAUSE)
        await pause(self.nodes[rng.choice(alive)].proc, seconds)
        return "pause_node_long" if seconds > self.heartbeat_timeout else "pause_node_short"

    async def leave(self, rng: random.Random) -> str:
        """A node leaves on purpose (SIGTERM: drain, hand over, exit), and comes back
        a few seconds later."""
        alive = [i for i in self.alive() if i != self.spare and self.wanted[i]]
        if len(alive) < 2:
            return "leave_skipped"
        victim = rng.choice(alive)
        clean = await self._terminate(victim)
        await asyncio.sleep(rng.uniform(*AWAY))
        self._start_later(victim, 0.0)
        return "leave" if clean else "leave_not_clean"

    async def join(self, rng: random.Random) -> str:
        """The spare node joins (takes its share of the partitions), stays a while, and
        leaves (SIGTERM)."""
        self._start_later(self.spare, 0.0)
        await asyncio.sleep(rng.uniform(*JOINED))
        clean = await self._terminate(self.spare)
        return "join" if clean else "join_leave_not_clean"

    async def _terminate(self, i: int) -> bool:
        """SIGTERM node ``i`` (not wanted any more) and wait for its exit; True if it
        exited of the SIGTERM by itself within ``LEAVE_WAIT``."""
        self.wanted[i] = False
        self._due.pop(i, None)
        node = self.nodes[i]
        if node.proc is None or not node.alive:
            return True
        self._signalled.add(i)
        node.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(node.proc.wait, LEAVE_WAIT)
        except Exception:
            await asyncio.to_thread(node.kill)
            return False
        return True

    def restore(self) -> None:
        """After the chaos: every node the cluster started with is wanted again (a node
        whose leave the chaos's end cut short is started now); the spare stays as it is."""
        for i in range(self.size):
            if not self.wanted[i]:
                self._start_later(i, 0.0)

    def _start_later(self, i: int, delay: float) -> None:
        self.wanted[i] = True
        self._due[i] = time.monotonic() + delay

    # --- the supervisor and the watch ---------------------------------------------------

    async def _supervise(self) -> None:
        rng = random.Random(len(self.nodes))
        while True:
            await asyncio.sleep(0.1)
            for i, node in enumerate(self.nodes):
                if node.proc is not None and not node.alive and self.wanted[i]:
                    if i not in self._due:
                        if i not in self._signalled:
                            self.stepped_down += 1
                        self._due[i] = time.monotonic() + rng.uniform(*RESTART_DELAY)
                    self._signalled.discard(i)
                due = self._due.get(i)
                if due is not None and time.monotonic() >= due and not node.alive:
                    del self._due[i]
                    if node.proc is not None:
                        await asyncio.to_thread(node.kill)  # reap it
                    try:
                        await asyncio.to_thread(node.start, ready=False, timeout=60)
                        self.restarts += 1
                    except (RuntimeError, TimeoutError):  # it died starting (a SIGKILL)
                        self._due[i] = time.monotonic() + 1.0  # try again

    async def _watch(self) -> None:
        since: dict[int, float] = {}
        last: dict[int, str | None] = {}
        conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        while True:
            await asyncio.sleep(WATCH)
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(self.database, autocommit=True)
                owners, live = await _owners(conn)
            except psycopg.Error:
                self.watch_errors += 1
                conn = None
                continue
            now = time.monotonic()
            for p, owner in owners.items():
                if p in last and last[p] != owner:
                    self.moves += 1
                last[p] = owner
                if owner not in live:
                    since.setdefault(p, now)
                elif p in since:
                    self.unserved.append(now - since.pop(p))

    async def ownership(self) -> list[str]:
        """What is wrong with the partitions' ownership now (nothing: ``[]``): every
        partition's lock held by exactly one live node, and ``dex_partitions`` naming it;
        every wanted node running and live."""
        async with await psycopg.AsyncConnection.connect(self.database, autocommit=True) as conn:
            cur = await conn.execute(LIVE_NODES)
            nodes = await cur.fetchall()
            by_pid = {pid: node_id for node_id, _, _, pid in nodes}
            addresses = {address for _, address, _, _ in nodes}
            holders: dict[int, list[str]] = {}
            cur = await conn.execute(HELD)
            for subid, objid, pid in await cur.fetchall():
                if subid == 2 and pid in by_pid:
                    holders.setdefault(int(objid), []).append(by_pid[pid])
            owners, _ = await _owners(conn)
        problems = []
        for p in range(len(owners) or DEFAULT_PARTITIONS):
            held = holders.get(p, [])
            if len(held) != 1:
                problems.append(f"partition {p} held by {len(held)} live nodes: {held}")
            elif owners.get(p) != held[0]:
                problems.append(f"partition {p} held by {held[0]}, recorded {owners.get(p)}")
        for i, node in enumerate(self.nodes):
            if self.wanted[i] and (not node.alive or node.address not in addresses):
                problems.append(f"node-{i} ({node.address}) is wanted but not live")
        return problems

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in self.workers:
            await asyncio.to_thread(worker.kill)
        for node in self.nodes:
            if node.proc is not None and node.alive:
                node.proc.send_signal(signal.SIGCONT)
            await asyncio.to_thread(node.kill)

    def logs(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))


async def _owners(
    conn: psycopg.AsyncConnection[tuple[Any, ...]],
) -> tuple[dict[int, str | None], set[str]]:
    """Each partition's recorded owner, and the live nodes' ids."""
    cur = await conn.execute("SELECT id, owner FROM dex_partitions")
    owners = {int(p): owner for p, owner in await cur.fetchall()}
    cur = await conn.execute(LIVE_NODES)
    live = {node_id for node_id, _, _, _ in await cur.fetchall()}
    return owners, live


def cluster_faults(
    cluster: NodeCluster,
    rng: random.Random,
    *,
    worker_kill_every: float,
    node_kill_every: float,
    pause_every: float,
    leave_every: float,
    join_every: float,
) -> list[Fault]:
    async def kill_worker() -> str:
        await asyncio.to_thread(cluster.kill_worker, rng)
        return "kill_worker"

    return [
        f
        for f in [
            Fault("kill_worker", worker_kill_every, kill_worker),
            Fault("kill_node", node_kill_every, lambda: cluster.kill_node(rng)),
            Fault("pause_node", pause_every, lambda: cluster.pause_node(rng)),
            Fault("leave", leave_every, lambda: cluster.leave(rng)),
            Fault("join", join_every, lambda: cluster.join(rng)),
        ]
        if f.every > 0
    ]


async def settle_ownership(cluster: NodeCluster, seconds: float) -> list[str]:
    """Wait up to ``seconds`` for the ownership to be right; what is still wrong then."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(psycopg.Error):
            problems = await cluster.ownership()
            if not problems or time.monotonic() > deadline:
                return problems
        if time.monotonic() > deadline:
            return ["PostgreSQL did not answer"]
        await asyncio.sleep(0.5)

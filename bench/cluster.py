"""Dex as a cluster on PostgreSQL: turns/s and CPU per turn with 1, 2 and 3 nodes, and how
long a partition goes unserved when its node dies, hangs or hands it over (issue #34's
figures), each beside the single-node figure from the same run.

    .venv/bin/python -m bench.cluster [--seconds 5] [--kills 20] [--hangs 5] [--handovers 5]
                                      [--pair-kills 5]
    .venv/bin/python -m bench.cluster --short        # CI: under 2 minutes

Nodes (``dex server`` without ``--standby``) share one fresh PostgreSQL database and its
64 partitions; each has a Worker of its own (``bench/agents.py``: model -> ``read`` tool
-> model, no-op bodies, 3 Steps a turn) connected to it alone, since a node hands out only
its own partitions' Steps. The client in this process sends each session's calls to the
node that owns the session's partition (``Router.route``: ``dex_partitions.owner`` read
from PostgreSQL every ``POLL`` seconds; on a 503, a refused connection, or the partition
moving to another node while a call waits, the call goes again to the owner then, with
the same ``message_id``, so it is one message however often it is sent).

1. Throughput: ``bench.turns``'s lanes (each session sends its next message when its turn
   ended) at 64 and 256 sessions with 1, 2 and 3 nodes; CPU per turn of each process from
   /proc: every node, the Workers, this client, and PostgreSQL (the backends connected to
   the bench's database, and its background processes apart); PostgreSQL commits
   (``pg_stat_database.xact_commit``) and WAL bytes (``pg_current_wal_lsn()``) per turn.
2. Takeover, three nodes under light load: SIGKILL a node that owns partitions; for (up to)
   three of its partitions, the time from the kill until a turn of a session there
   completes through a surviving node; and until all its partitions are owned by live
   nodes again (also with two nodes, after their throughput phases: 32 partitions taken
   by one node). The node is started again and rejoins; the next fault waits until every
   node owns its share (21 or 22 of 64 among three) and has its Worker.
3. The same with SIGSTOP (a hung node; then SIGKILL, and started again), and 4. with
   SIGTERM (a planned hand-over: the node drains and frees its partitions).
5. Correctness: every message sent was received exactly once (each session's
   ``messages_received`` equals the sends) and answered; no session runs at the end.
   A failed check exits 1; timing targets do not (shared machines are noisy).

The database and a temporary directory are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg

import dex
from dex.server.ha.lease import LIVE_NODES
from dex.server.store.partitions import DEFAULT_PARTITIONS, partition_of
from dex.testing import ServerProcess, WorkerProcess

from . import agents
from .takeover import drop_database, fresh_database
from .turns import (
    AGENT,
    WORKER_CAPACITY,
    Lane,
    Phase,
    cpu_seconds,
    machine_busy_seconds,
    metrics,
    percentile,
    render_table,
)

NODES = 3
POLL = 0.025
"""Seconds between two reads of who owns each partition."""
LONG_POLL = 2.0
"""How long one request waits for a turn on the server before it asks again."""
SLACK = 2.0
LIGHT_LANES = 4
"""Sessions doing turns all along while the faults are measured (besides the probes)."""
PROBED = 3
"""Partitions of the failed node whose first turn after the fault is timed."""
BALANCE_TIMEOUT = 60.0
TARGETS = {"kill": 2.0, "stop": 4.0, "term": 1.0}
"""Seconds: p99 of a dead node's takeover, a hung node's, a planned hand-over's gap."""
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
CPU_BAR = 1.10
"""The cluster's server CPU per turn over one node's, at most."""
SCALE_BAR = 1.25
"""Two nodes' turns/s over one node's, at least."""
RELOADED = b"the session was reloaded; try again"
"""A 409 a node answers when the session's state in memory was replaced while the call
waited for it (its partition was just taken and recovered, say): nothing was recorded,
so the call is sent again (a send keeps its ``message_id``). ``dex.Client`` raises it
as ``Conflict``; the report counts them."""
BENCH_APP = "dex-bench-cluster"
"""The application_name of the bench's own PostgreSQL connections (not counted)."""


# --- who serves a session --------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    node_id: str | None
    address: str | None


Conn = psycopg.AsyncConnection[tuple[Any, ...]]


class Owners:
    """Who serves each partition, read from PostgreSQL every ``POLL`` seconds: the node
    that last took it (``dex_partitions.owner``) with its address, and the live nodes
    (those that hold their node lock). After a node died its partitions still name it
    until the survivors have taken them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = DEFAULT_PARTITIONS
        self.of: dict[int, Owner] = {}
        self.live: dict[str, str] = {}
        """Node id -> address, of the nodes live now."""
        self._changed = asyncio.Event()
        self._moves: dict[tuple[int, str | None], asyncio.Future[None]] = {}
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, application_name=BENCH_APP
        )
        await self.read()
        self._task = asyncio.create_task(self._poll())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL)
            with contextlib.suppress(psycopg.Error):
                await self.read()

    async def read(self) -> None:
        assert self._conn is not None
        cur = await self._conn.execute(
            "SELECT p.id, p.owner, n.address FROM dex_partitions p "
            "LEFT JOIN dex_nodes n ON n.id = p.owner"
        )
        of = {int(p): Owner(owner, address) for p, owner, address in await cur.fetchall()}
        cur = await self._conn.execute(LIVE_NODES)
        live = {node_id: address for node_id, address, _, _ in await cur.fetchall()}
        if of:
            self.count = len(of)
        changed = of != self.of or live != self.live
        self.of, self.live = of, live
        if changed:
            self._changed.set()
            self._changed = asyncio.Event()
            for (p, node_id), fut in list(self._moves.items()):
                if of.get(p, Owner(None, None)).node_id != node_id:
                    del self._moves[(p, node_id)]
                    if not fut.done():
                        fut.set_result(None)

    def moved(self, partition: int, node_id: str | None) -> asyncio.Future[None]:
        """Done once ``partition`` is owned by another node than ``node_id``."""
        key = (partition, node_id)
        fut = self._moves.get(key)
        if fut is None:
            fut = self._moves[key] = asyncio.get_running_loop().create_future()
        return fut

    async def change(self, timeout: float) -> None:
        """Wait for the next read that changed anything, for up to ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def node_of(self, address: str) -> str | None:
        """The live node at ``address``."""
        return next((n for n, a in self.live.items() if a == address), None)

    def partitions_of(self, node_id: str) -> list[int]:
        return sorted(p for p, o in self.of.items() if o.node_id == node_id)

    def counts(self) -> Counter[str | None]:
        return Counter(o.node_id for o in self.of.values())


class Router:
    """The bench's client: ``create_session`` and ``send_message`` as ``dex.Client`` has
    them (``bench.turns.Lane`` drives it), each call sent to ``route(session_id)``. A call
    is tried again, with the same body, until its deadline, whenever it gets a 503, a 409
    ``RELOADED`` or no answer, or the session's partition moves to another node while it
    waits. It counts the messages sent and answered per session."""

    def __init__(self, owners: Owners) -> None:
        self.owners = owners
        self.route: Callable[[str], str | None] = self.owner_address
        """Where a session's calls go. Once any node answers any call (forwarding), this
        can be "any node"."""
        self.sent: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.reloaded = 0
        """Calls refused with ``RELOADED`` (and sent again)."""
        self._ids = itertools.count(1)
        self._http: aiohttp.ClientSession | None = None

    def owner_address(self, session_id: str) -> str | None:
        owner = self.owners.of.get(partition_of(session_id, self.owners.count))
        return owner.address if owner is not None else None

    async def __aenter__(self) -> Router:
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def create_session(self, agent: str, session_id: str | None = None) -> dict[str, Any]:
        sid = session_id or f"s_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"
        try:
            created, _ = await self.call(
                sid, "POST", "/v1/sessions", body={"agent": agent, "session_id": sid}
            )
        except dex.Conflict:  # made by a try whose answer was lost
            return {"id": sid}
        return created

    async def send_message(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """As ``dex.Client.send_message``; the turn also says which node answered
        (``served_by``). Each call is one message (its own ``message_id``)."""
        timeout = 30.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {"text": text, "message_id": message_id or f"m{next(self._ids)}"}
        if wait:
            body["wait_seconds"] = LONG_POLL
        self.sent[session_id] += 1
        path = f"/v1/sessions/{session_id}/messages"
        turn, address = await self.call(session_id, "POST", path, body=body, deadline=deadline)
        while wait and turn["status"] == "running" and time.monotonic() < deadline:
            path = f"/v1/sessions/{session_id}/turns/{turn['turn']}"
            params = {"wait_seconds": LONG_POLL}
            turn, address = await self.call(
                session_id, "GET", path, params=params, deadline=deadline
            )
        if turn["status"] != "running":
            self.answered[session_id] += 1
        turn["served_by"] = address
        return turn

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        snap, _ = await self.call(session_id, "GET", f"/v1/sessions/{session_id}")
        return snap

    async def call(
        self,
        session_id: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> tuple[dict[str, Any], str]:
        """The answer, and the address of the node that gave it."""
        deadline = deadline or time.monotonic() + 30.0
        data = orjson.dumps(body) if body is not None else None
        partition = partition_of(session_id, self.owners.count)
        last = "no node owns its partition"
        while True:
            if time.monotonic() > deadline:
                raise dex.Unavailable(f"{method} {path}: no answer in time ({last})")
            address = self.route(session_id)
            if address is None:
                await self.owners.change(0.05)
                continue
            owner = self.owners.of[partition].node_id
            request = asyncio.ensure_future(self._once(method, address + path, data, params))
            moved = self.owners.moved(partition, owner)
            await asyncio.wait((request, moved), return_when=asyncio.FIRST_COMPLETED)
            if not request.done():  # its partition moved meanwhile: ask the new owner
                request.cancel()
                await asyncio.gather(request, return_exceptions=True)
                last = f"partition {partition} moved"
                continue
            try:
                status, payload = request.result()
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                status, payload = 0, repr(e).encode()
            if status in (0, 503):  # gone, or does not serve it (now): look again
                last = f"{address}: {status or ''} {payload[:200]!r}"
                await self.owners.change(0.02)
                continue
            if status == 409 and RELOADED in payload:  # a retryable refusal: the same again
                self.reloaded += 1
                await asyncio.sleep(0.01)
                continue
            decoded = orjson.loads(payload) if payload else None
            if status >= 400 or not isinstance(decoded, dict):
                error = dex.Conflict if status == 409 else dex.ServerError
                raise error(f"{method} {address}{path}: HTTP {status} {payload[:300]!r}")
            return decoded, address

    async def _once(
        self, method: str, url: str, data: bytes | None, params: dict[str, Any] | None
    ) -> tuple[int, bytes]:
        assert self._http is not None
        headers = {"content-type": "application/json"} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=LONG_POLL + SLACK)
        async with self._http.request(
            method, url, data=data, params=params, headers=headers, timeout=timeout
        ) as response:
            return response.status, await response.read()


def session_in(partition: int, count: int, tag: str) -> str:
    """A session id in ``partition``."""
    for n in itertools.count():
        sid = f"s_{tag}_{partition}_{n}"
        if partition_of(sid, count) == partition:
            return sid
    raise AssertionError("unreachable")


# --- the nodes -------------------------------------------------------------------------


class Nodes:
    """Up to ``NODES`` ``dex server`` nodes on one database, each with its own Worker."""

    def __init__(self, directory: Path, database: str) -> None:
        module = str(Path(agents.__file__).resolve())  # the Worker loads it by path
        self.servers = [
            ServerProcess(directory / f"node{i}", database=database) for i in range(NODES)
        ]
        self.workers = [
            WorkerProcess(module, s.address, directory / f"worker{i}.log", capacity=WORKER_CAPACITY)
            for i, s in enumerate(self.servers)
        ]
        self.up: list[int] = []
        """The nodes started (in order)."""

    async def start(self, i: int) -> None:
        await asyncio.to_thread(self.servers[i].start)
        if not self.workers[i].alive:
            self.workers[i].start()
        if i not in self.up:
            self.up.append(i)

    async def balanced(self, owners: Owners, http: aiohttp.ClientSession) -> bool:
        """Every started node is live, owns its share (within one), and has every running
        Worker connected (each Worker connects to every node: a node whose own Worker is
        still starting would put that start-up's CPU into the next measured phase)."""
        live = set(owners.live)
        if sorted(owners.live.values()) != sorted(self.servers[i].address for i in self.up):
            return False
        counts = owners.counts()
        low = owners.count // len(self.up)
        high = low + (1 if owners.count % len(self.up) else 0)
        if set(counts) != live or any(not low <= c <= high for c in counts.values()):
            return False
        workers = sum(1 for w in self.workers if w.alive)
        for i in self.up:
            try:
                found = await metrics(http, self.servers[i].address)
            except (aiohttp.ClientError, OSError):
                return False
            if found.get("dex_workers_connected", 0) < workers:
                return False
        return True

    async def wait_balanced(self, owners: Owners, http: aiohttp.ClientSession) -> float:
        """Seconds until balanced (``TimeoutError`` after ``BALANCE_TIMEOUT``)."""
        started = time.perf_counter()
        while not await self.balanced(owners, http):
            if time.perf_counter() - started > BALANCE_TIMEOUT:
                raise TimeoutError(
                    f"the nodes did not balance within {BALANCE_TIMEOUT:g}s: "
                    f"{dict(owners.counts())}, live {owners.live}"
                )
            await owners.change(0.2)
        return time.perf_counter() - started

    def stop(self) -> None:
        for proc in [*self.workers, *self.servers]:
            if proc.proc is not None and proc.alive:
                proc.proc.send_signal(signal.SIGCONT)
                proc.kill()

    def tails(self) -> str:
        out = []
        for i, proc in enumerate(self.servers):
            if proc.proc is not None:
                out.append(f"--- node{i} log (tail) ---\n{proc.output()[-2000:]}")
        return "\n".join(out)


# --- 1. throughput ---------------------------------------------------------------------


@dataclass
class Measured:
    nodes: int
    phase: Phase
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds over the phase: ``node0``.. , ``servers``, ``workers``, ``client``,
    ``pg`` (backends of the bench's database), ``pg_other`` (background), ``machine``."""
    store_commits: float = 0.0
    pg_commits: float = 0.0
    wal_bytes: float = 0.0

    def per_turn(self, key: str) -> float:
        return self.cpu[key] / max(self.phase.turns, 1)


@dataclass
class PgSample:
    backends: dict[int, float]
    background: dict[int, float]
    commits: int
    wal: int


async def pg_sample(conn: Conn) -> PgSample:
    """CPU so far of the PostgreSQL processes that serve the bench's database (not the
    bench's own connections) and of its background processes (shared by every database
    of the server), the database's commits, and the WAL position."""
    cur = await conn.execute(
        "SELECT pid, datname IS NOT NULL FROM pg_stat_activity "
        "WHERE (datname = current_database() OR datname IS NULL) "
        "AND application_name <> %s",
        (BENCH_APP,),
    )
    backends: dict[int, float] = {}
    background: dict[int, float] = {}
    for pid, ours in await cur.fetchall():
        with contextlib.suppress(OSError):  # gone meanwhile
            (backends if ours else background)[pid] = cpu_seconds(pid, pid)
    cur = await conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    cur = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
    wal = await cur.fetchone()
    assert row is not None and wal is not None
    return PgSample(backends, background, int(row[0]), int(wal[0]))


def _grown(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two samples by the processes live at the second (one started
    meanwhile counts whole; one that ended meanwhile is lost)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _cpu(nodes: Nodes) -> dict[str, float]:
    cpu = {f"node{i}": cpu_seconds(nodes.servers[i].pid) for i in nodes.up}
    cpu["workers"] = sum(cpu_seconds(nodes.workers[i].pid) for i in nodes.up)
    cpu["client"] = time.process_time()
    cpu["machine"] = machine_busy_seconds()
    return cpu


async def _store_commits(nodes: Nodes, http: aiohttp.ClientSession) -> float:
    total = 0.0
    for i in nodes.up:
        found = await metrics(http, nodes.servers[i].address)
        total += found.get("dex_store_commits_total", float("nan"))
    return total


async def measure(
    router: Router,
    nodes: Nodes,
    conn: Conn,
    http: aiohttp.ClientSession,
    concurrency: int,
    seconds: float,
    warmup: float,
) -> Measured:
    lanes = [Lane(router, 20) for _ in range(concurrency)]
    await asyncio.gather(*(lane.run(time.perf_counter() + warmup, None) for lane in lanes))
    m = Measured(len(nodes.up), Phase(concurrency))
    pg_before, commits_before = await pg_sample(conn), await _store_commits(nodes, http)
    cpu_before = _cpu(nodes)
    start = time.perf_counter()
    await asyncio.gather(*(lane.run(start + seconds, m.phase) for lane in lanes))
    m.phase.seconds = time.perf_counter() - start
    cpu_after = _cpu(nodes)
    pg_after, commits_after = await pg_sample(conn), await _store_commits(nodes, http)
    m.cpu = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
    m.cpu["servers"] = sum(m.cpu[f"node{i}"] for i in nodes.up)
    m.cpu["pg"] = _grown(pg_before.backends, pg_after.backends)
    m.cpu["pg_other"] = _grown(pg_before.background, pg_after.background)
    m.store_commits = commits_after - commits_before
    m.pg_commits = pg_after.commits - pg_before.commits
    m.wal_bytes = pg_after.wal - pg_before.wal
    return m


# --- 2-4. faults -----------------------------------------------------------------------


@dataclass
class Faults:
    gaps: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    """By fault and node count: seconds from the fault to the first turn through a
    survivor, per partition probed."""
    taken: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)
    """By fault and node count: (the failed node's partitions, seconds until live nodes
    owned them all)."""
    probes: dict[int, str] = field(default_factory=dict)
    """A session in each partition."""
    problems: list[str] = field(default_factory=list)


async def fault(
    kind: str,
    victim: int,
    nodes: Nodes,
    owners: Owners,
    router: Router,
    faults: Faults,
) -> None:
    """Fault node ``victim`` (``kind``: kill, stop, term), time its partitions' takeover,
    then start it again and wait until the nodes are balanced."""
    server = nodes.servers[victim]
    assert server.proc is not None
    node_id = owners.node_of(server.address)
    assert node_id is not None, "the victim is not live"
    mine = owners.partitions_of(node_id)
    chosen = random.sample(mine, min(PROBED, len(mine)))
    started = time.perf_counter()
    server.proc.send_signal(SIGNALS[kind])

    async def probe(partition: int) -> float:
        n = 0
        while True:
            n += 1
            turn = await router.send_message(
                faults.probes[partition], f"probe {n}", wait=True, timeout=60
            )
            if turn["status"] != "completed":
                faults.problems.append(f"{kind}: a probe turn ended {turn['status']}: {turn}")
            elif turn["served_by"] != server.address:
                return time.perf_counter() - started

    async def all_taken() -> float:
        while any(
            owners.of[p].node_id == node_id or owners.of[p].node_id not in owners.live for p in mine
        ):
            await owners.change(0.1)
        return time.perf_counter() - started

    gaps, taken = await asyncio.gather(
        asyncio.wait_for(asyncio.gather(*(probe(p) for p in chosen)), 90),
        asyncio.wait_for(all_taken(), 90),
    )
    key = (kind, len(nodes.up))
    faults.gaps.setdefault(key, []).extend(gaps)
    faults.taken.setdefault(key, []).append((len(mine), taken))
    if kind == "term":
        await asyncio.to_thread(server.proc.wait, 60)
    else:
        server.kill()  # a stopped process dies of SIGKILL too
    await nodes.start(victim)


async def run_faults(
    rounds: list[tuple[str, int]],
    nodes: Nodes,
    owners: Owners,
    router: Router,
    http: aiohttp.ClientSession,
    faults: Faults,
) -> None:
    """Each fault of ``rounds`` (kind, times) in turn, on the nodes in turn, under light
    load; the nodes balanced before each."""
    await nodes.wait_balanced(owners, http)
    if not faults.probes:
        faults.probes = {p: session_in(p, owners.count, "probe") for p in range(owners.count)}
        await asyncio.gather(*(router.create_session(AGENT, s) for s in faults.probes.values()))
    stop, light = asyncio.Event(), Phase(LIGHT_LANES)
    load = asyncio.create_task(light_load(router, stop, light))
    try:
        for kind, times in rounds:
            for i in range(times):
                print(f"{len(nodes.up)} nodes: {kind} {i + 1}/{times} ...", flush=True)
                victim = nodes.up[i % len(nodes.up)]
                await fault(kind, victim, nodes, owners, router, faults)
                await nodes.wait_balanced(owners, http)
    finally:
        stop.set()
        await load
    faults.problems += [f"light load: {n} turns failed: {e}" for e, n in light.errors.items()]


async def light_load(router: Router, stop: asyncio.Event, phase: Phase) -> None:
    lanes = [Lane(router, 20) for _ in range(LIGHT_LANES)]

    async def run(lane: Lane) -> None:
        while not stop.is_set():
            await lane.run(time.perf_counter() + 0.5, phase)

    await asyncio.gather(*(run(lane) for lane in lanes))


# --- 5. correctness --------------------------------------------------------------------


async def correctness(router: Router, addresses: list[str]) -> tuple[str, list[str]]:
    """Every message sent was received once and answered; no session runs."""
    problems = []
    sent, answered = sum(router.sent.values()), sum(router.answered.values())
    if sent != answered:
        unanswered = [s for s in router.sent if router.sent[s] != router.answered[s]]
        problems.append(f"{sent - answered} messages sent got no answer (in {unanswered[:5]})")
    gate = asyncio.Semaphore(16)
    received = 0

    async def check(sid: str) -> None:
        nonlocal received
        async with gate:
            snap = await router.snapshot(sid)
        got = snap["session"]["messages_received"]
        received += got
        if got != router.sent[sid]:
            problems.append(f"session {sid}: {router.sent[sid]} messages sent, {got} received")

    await asyncio.gather(*(check(s) for s in list(router.sent)))
    async with dex.Client(addresses) as client:
        running = (await client.list_sessions(status="running", limit=100))["sessions"]
    problems += [f"session {s['id']} is still running at the end" for s in running]
    line = (
        f"Correctness: {sent} messages sent to {len(router.sent)} sessions, {answered} "
        f"answered, {received} received by the sessions (each session's messages_received); "
        f"{len(running)} sessions running at the end: {'OK' if not problems else 'FAILED'}",
        f"  calls answered 409 'the session was reloaded; try again' (and sent again): "
        f"{router.reloaded}",
    )
    return "\n".join(line), problems


# --- the report ------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def throughput_report(runs: list[Measured], args: argparse.Namespace) -> list[str]:
    out = [
        "",
        f"Throughput: turns of bench/agents.py (model -> read tool -> model, 3 Steps), "
        f"{args.seconds:g} s per phase after {args.warmup:g} s warm-up;",
        f"  {os.cpu_count()} CPUs shared by every process; one PostgreSQL database, "
        f"{DEFAULT_PARTITIONS} partitions; one Worker (capacity {WORKER_CAPACITY}) per node; "
        "the client sends each session's calls to its partition's owner",
        "",
    ]
    rows = []
    for m in runs:
        p = m.phase
        rows.append(
            [
                str(m.nodes),
                str(p.concurrency),
                str(p.turns),
                f"{p.turns_per_s:.0f}",
                ms(p.pct(50)),
                ms(p.pct(99)),
                str(p.failed),
                f"{m.store_commits / max(p.turns, 1):.2f}",
                f"{m.pg_commits / max(p.turns, 1):.2f}",
                f"{m.wal_bytes / max(p.turns, 1):.0f}",
            ]
        )
    header = ["nodes", "sessions", "turns", "turns/s", "p50 ms", "p99 ms", "failed"]
    header += ["Dex commits/turn", "PG commits/turn", "WAL bytes/turn"]
    out.append(render_table(rows, header))
    out += [
        "  Dex commits: dex_store_commits_total of every node (group commits); PG commits:",
        "  pg_stat_database.xact_commit of the database (with the lease pings and the",
        "  bench's reads); WAL bytes: pg_current_wal_lsn() moved (every database of the",
        "  server: keep it otherwise idle).",
        "",
        "CPU per turn, ms (CPU time of each process over the phase / turns)",
    ]
    rows = []
    for m in runs:
        nodes = "/".join(ms(m.per_turn(k)) for k in sorted(m.cpu) if k.startswith("node"))
        ours = sum(m.cpu[k] for k in ("servers", "workers", "client", "pg", "pg_other"))
        rows.append(
            [
                str(m.nodes),
                str(m.phase.concurrency),
                ms(m.per_turn("servers")),
                nodes,
                ms(m.per_turn("workers")),
                ms(m.per_turn("client")),
                ms(m.per_turn("pg")),
                ms(m.per_turn("pg_other")),
                ms(ours / max(m.phase.turns, 1)),
                f"{m.cpu['machine'] / m.phase.seconds:.2f}",
                f"{max(0.0, m.cpu['machine'] - ours) / m.phase.seconds:.2f}",
            ]
        )
    header = ["nodes", "sessions", "servers", "(each node)", "Workers", "client"]
    header += ["PG backends", "PG background", "total", "machine busy, CPUs", "not ours, CPUs"]
    out.append(render_table(rows, header))
    out += [
        "  PG backends: the PostgreSQL processes connected to the bench's database (its",
        "  lookups of the owners excluded); PG background: walwriter, checkpointer and the",
        "  like, which serve every database of the server.",
        "",
        "Cluster vs one node (same run)",
    ]
    by = {(m.nodes, m.phase.concurrency): m for m in runs}
    for (n, c), m in sorted(by.items()):
        one = by.get((1, c))
        if n == 1 or one is None or not one.phase.turns or not m.phase.turns:
            continue
        scale = m.phase.turns_per_s / one.phase.turns_per_s
        cpu = m.per_turn("servers") / one.per_turn("servers")
        line = f"  {c} sessions, {n} nodes: {scale:.2f}x the turns/s of one node"
        if n == 2:
            line += f" (bar >= {SCALE_BAR:g}: {'met' if scale >= SCALE_BAR else 'MISSED'})"
        line += (
            f"; server CPU per turn {cpu:.2f}x one node's "
            f"(bar <= {CPU_BAR:g}: {'met' if cpu <= CPU_BAR else 'MISSED'})"
        )
        out.append(line)
    noisy = [m for m in runs if m.phase.seconds and _not_ours(m) / m.phase.seconds > 0.2]
    if noisy:
        out.append(
            "  WARNING: other processes used the CPUs during "
            + ", ".join(f"{m.nodes} nodes x {m.phase.concurrency}" for m in noisy)
            + ": run again on a quiet machine."
        )
    return out


def _not_ours(m: Measured) -> float:
    ours = sum(m.cpu[k] for k in ("servers", "workers", "client", "pg", "pg_other"))
    return max(0.0, m.cpu["machine"] - ours)


NAMES = {
    "kill": "Takeover of a dead node's partitions (SIGKILL)",
    "stop": "Takeover of a hung node's partitions (SIGSTOP)",
    "term": "Planned hand-over (SIGTERM: the node drains and frees its partitions)",
}


def faults_report(faults: Faults) -> list[str]:
    out = [
        "",
        f"Takeover: {LIGHT_LANES} sessions doing turns all along; after each fault, a turn on "
        f"a session of each of {PROBED} of the node's partitions;",
        "  gap: from the fault until that turn completed through a surviving node",
    ]
    for kind, n in sorted(faults.gaps, key=lambda k: (list(TARGETS).index(k[0]), -k[1])):
        gaps, taken = faults.gaps[(kind, n)], faults.taken[(kind, n)]
        target = TARGETS[kind]
        worst = percentile(gaps, 99) if kind == "kill" else max(gaps)
        verdict = "met" if worst <= target else "MISSED"
        which = "p99" if kind == "kill" else "max"
        out.append(
            f"  {NAMES[kind]}, {n} nodes, {len(taken)} times: gap p50 "
            f"{statistics.median(gaps):.3f} s  p99 {percentile(gaps, 99):.3f} s  max "
            f"{max(gaps):.3f} s ({len(gaps)} partitions); target {which} <= {target:g} s: "
            f"{verdict}"
        )
        counts = sorted({c for c, _ in taken})
        seconds = [t for _, t in taken]
        each = ""
        if kind == "kill":  # no lease to run out first: the takeover's own pace
            each = f" ({1000 * statistics.median(t / c for c, t in taken):.1f} ms a partition)"
        out.append(
            f"    all of the node's {'/'.join(map(str, counts))} partitions owned by live nodes "
            f"again after p50 {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s" + each
        )
    return out


# --- main ------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, tmp: Path, database: str) -> tuple[str, list[str]]:
    nodes = Nodes(tmp, database)
    owners = Owners(database)
    out: list[str] = []
    problems: list[str] = []
    try:
        async with aiohttp.ClientSession() as http, Router(owners) as router:
            print("starting node 1 ...", flush=True)
            await nodes.start(0)
            await owners.open()
            conn = await psycopg.AsyncConnection.connect(
                database, autocommit=True, application_name=BENCH_APP
            )
            runs: list[Measured] = []
            faults = Faults()
            try:
                for n in args.nodes:
                    while len(nodes.up) < n:
                        print(f"starting node {len(nodes.up) + 1} ...", flush=True)
                        await nodes.start(len(nodes.up))
                    await nodes.wait_balanced(owners, http)
                    for c in args.concurrency:
                        print(f"{n} nodes, {c} sessions ...", flush=True)
                        runs.append(
                            await measure(router, nodes, conn, http, c, args.seconds, args.warmup)
                        )
                    if n == 2 and args.pair_kills:  # a node owning 32 partitions dies
                        rounds = [("kill", args.pair_kills)]
                        await run_faults(rounds, nodes, owners, router, http, faults)
            finally:
                await conn.close()
            out += throughput_report(runs, args)
            for m in runs:
                problems += [
                    f"{m.nodes} nodes x {m.phase.concurrency}: {n} turns failed: {e}"
                    for e, n in m.phase.errors.items()
                ]

            while len(nodes.up) < NODES:
                print(f"starting node {len(nodes.up) + 1} ...", flush=True)
                await nodes.start(len(nodes.up))
            rounds = [("kill", args.kills), ("stop", args.hangs), ("term", args.handovers)]
            await run_faults(rounds, nodes, owners, router, http, faults)
            out += faults_report(faults)
            problems += faults.problems

            print("checking every session ...", flush=True)
            addresses = [nodes.servers[i].address for i in nodes.up]
            line, found = await correctness(router, addresses)
            out += ["", line]
            problems += found
    except BaseException:
        print(nodes.tails(), file=sys.stderr)
        raise
    finally:
        await owners.close()
        nodes.stop()
    return "\n".join(out), problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds a phase")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of a node (default 20)")
    parser.add_argument(
        "--pair-kills",
        type=int,
        default=5,
        help="SIGKILLs of one of two nodes (32 partitions each), after the 2-node phases "
        "(default 5)",
    )
    parser.add_argument("--hangs", type=int, default=5, help="SIGSTOPs of a node (default 5)")
    parser.add_argument("--handovers", type=int, default=5, help="SIGTERMs of a node (default 5)")
    parser.add_argument(
        "--short",
        action="store_true",
        help="CI: 1 and 2 nodes at 64 sessions for 3 s each, 3 kills, 1 hang, 1 hand-over",
    )
    args = parser.parse_args(argv)
    args.nodes, args.concurrency = [1, 2, 3], [64, 256]
    if args.short:
        args.nodes, args.concurrency = [1, 2], [64]
        args.seconds, args.warmup = 3.0, 1.0
        args.kills, args.pair_kills, args.hangs, args.handovers = 3, 1, 1, 1
    counts = (args.kills, args.pair_kills, args.hangs, args.handovers)
    if args.seconds <= 0 or args.warmup < 0 or min(counts) < 0:
        parser.error("--seconds must be > 0, --warmup and the fault counts >= 0")
    return args


@contextlib.contextmanager
def database() -> Iterator[str]:
    name, url = fresh_database()
    try:
        yield url
    finally:
        drop_database(name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with database() as url, tempfile.TemporaryDirectory(prefix="dex-cluster-") as tmp:
        text, problems = asyncio.run(bench(args, Path(tmp), url))
    print(text)
    print(f"\n({time.perf_counter() - started:.0f} s in all)")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

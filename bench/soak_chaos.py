"""The processes ``bench.soak`` runs and the faults it injects into them.

``Cluster`` owns one Dex Server node (SQLite, its data directory) and a few Worker
processes that reach the node through ``Proxy``, a TCP proxy on loopback the soak
controls. ``Chaos`` runs one loop per fault kind; each sleeps about its interval (0.5x
to 1.5x, from a seeded random generator), then injects its fault and waits for it to
end (a paused process is resumed, a stalled proxy flows again) before the next one, so
when the chaos stops nothing is left broken. Faults of different kinds overlap.

A fault is a ``Fault``: a name, an interval and a coroutine that injects it and returns
the kind to count. A later high-availability fault ("SIGKILL the leader, a standby takes
over") is one more ``Fault`` over a cluster with two nodes; nothing else changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dex.testing import ServerProcess, WorkerProcess, free_port

AGENTS = str(Path(__file__).with_name("soak_agents.py"))
KILLS = ("kill_worker", "kill_server", "kill_leader", "kill_node", "kill_node_leaving")
"""The fault kinds that are a SIGKILL: the soak's bound on kills counts these."""


class Proxy:
    """A TCP proxy from ``port`` to ``upstream`` on loopback. ``cut()`` closes every
    connection at once; ``stall(seconds)`` stops moving bytes for a while (a network
    that hangs without closing anything), then lets them flow again."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self) -> int:
        """Close every open connection; return how many there were."""
        links = list(self._links)
        self._links.clear()
        for a, b in links:
            a.close()
            b.close()
        return len(links)

    async def stall(self, seconds: float) -> None:
        self._flowing.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._flowing.set()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_w.close()  # the node is down: the Worker sees a refused connection
            return
        link = (client_w, server_w)
        self._links.add(link)
        try:
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        finally:
            self._links.discard(link)
            client_w.close()
            server_w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the other side went away, or the proxy cut the link
        finally:
            writer.close()


class WorkerPool:
    """The soak's Worker processes, for either cluster: start one, SIGKILL one."""

    directory: Path
    ledger: Path
    workers: list[WorkerProcess]
    started_workers: int

    @property
    def worker_address(self) -> str:
        raise NotImplementedError

    def start_worker(self) -> WorkerProcess:
        self.started_workers += 1
        worker = WorkerProcess(
            AGENTS,
            self.worker_address,
            self.directory / f"worker-{self.started_workers}.log",
            env={"DEX_SOAK_LEDGER": str(self.ledger)},
        ).start()
        self.workers.append(worker)
        return worker

    def kill_worker(self, rng: random.Random) -> None:
        """SIGKILL one Worker and start a new one in its place."""
        alive = [w for w in self.workers if w.alive]
        if alive:
            victim = rng.choice(alive)
            victim.kill()
            self.workers.remove(victim)
        self.start_worker()


@dataclass
class Cluster(WorkerPool):
    """One node on a data directory, Workers behind the proxy, all logs in ``directory``."""

    directory: Path
    ledger: Path
    workers_wanted: int
    heartbeat_timeout: float
    reconnect_grace: float
    server: ServerProcess = field(init=False)
    proxy: Proxy = field(init=False)
    disk_full: bool = False
    """Arm the node's ``sqlite.commit`` failpoint, so that ``fill_disk`` can fill its disk."""
    workers: list[WorkerProcess] = field(default_factory=list)
    started_workers: int = 0

    def __post_init__(self) -> None:
        env = {"DEX_RECONNECT_GRACE": str(self.reconnect_grace)}
        if self.disk_full:
            (self.directory / "failpoints").mkdir(exist_ok=True)
            env |= {
                "DEX_FAILPOINTS": "sqlite.commit=error",
                "DEX_FAILPOINT_DIR": str(self.directory / "failpoints"),
            }
        self.server = ServerProcess(
            self.directory / "data", heartbeat_timeout=self.heartbeat_timeout, env=env
        )
        self.proxy = Proxy(self.server.port)

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)
        await self.proxy.start()
        for _ in range(self.workers_wanted):
            self.start_worker()

    @property
    def worker_address(self) -> str:
        return self.proxy.address

    def restart_server(self) -> None:
        """SIGKILL the node and start it again on its data directory and port."""
        self.server.kill()
        self.server.start(timeout=60)

    @property
    def address(self) -> str:
        return self.server.address

    async def kill_server(self) -> str:
        await asyncio.to_thread(self.restart_server)
        return "kill_server"

    async def fill_disk(self, seconds: float) -> str:
        """The disk is full for ``seconds``: every commit fails as SQLite's own
        ``SQLITE_FULL`` (the ``sqlite.commit`` failpoint, switched on by its file, as in
        ``tests/e2e/test_storage_faults.py``), then there is room again."""
        switch = self.directory / "failpoints" / "sqlite.commit.fail"
        switch.write_text("")
        try:
            await asyncio.sleep(seconds)
        finally:
            switch.unlink()
        return "disk_full"

    async def stop(self) -> None:
        for worker in self.workers:
            await asyncio.to_thread(worker.kill)
        await asyncio.to_thread(self.server.kill)
        await self.proxy.close()

    def logs(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))


async def pause(proc: subprocess.Popen[bytes] | None, seconds: float) -> None:
    """SIGSTOP the process, wait, SIGCONT it (a no-op if it died meanwhile)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)


@dataclass(frozen=True)
class Fault:
    name: str
    every: float
    """Seconds between two injections, on average (0: never)."""
    inject: Callable[[], Awaitable[str]]
    """Inject the fault, wait until it is over, return the kind to count."""


class SoakCluster(Protocol):
    """What the faults need of a cluster: one SQLite node (``Cluster``), or two nodes on
    PostgreSQL (``bench.soak_postgres.HaCluster``)."""

    heartbeat_timeout: float
    workers: list[WorkerProcess]

    @property
    def server(self) -> ServerProcess: ...
    @property
    def proxy(self) -> Proxy | Any: ...
    @property
    def address(self) -> str: ...
    def kill_worker(self, rng: random.Random) -> None: ...
    async def kill_server(self) -> str: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def faults(
    cluster: SoakCluster,
    rng: random.Random,
    *,
    worker_kill_every: float,
    server_kill_every: float,
    pause_every: float,
    cut_every: float,
    postgres_restart_every: float = 0.0,
    restart_postgres: Callable[[], Awaitable[str]] | None = None,
    disk_full_every: float = 0.0,
    fill_disk: Callable[[float], Awaitable[str]] | None = None,
    database_cut_every: float = 0.0,
    cut_database: Callable[[], Awaitable[str]] | None = None,
) -> list[Fault]:
    """The soak's faults. A pause or a stall lasts either well under the heartbeat timeout
    (nothing should fail) or well over it (attempts fail while their code may run on: the
    at-most-once window). On two nodes, the node fault SIGKILLs the leader (the standby
    takes over) and a pause may outlast the leader's lease; ``postgres_restart_every``
    restarts the cluster's own PostgreSQL and ``database_cut_every`` cuts the leader off
    from it. On SQLite, ``disk_full_every`` fills the node's disk for 0.5 to 3 s."""
    short = cluster.heartbeat_timeout * 0.3
    long = cluster.heartbeat_timeout * 1.5 + 0.5

    async def kill_worker() -> str:
        await asyncio.to_thread(cluster.kill_worker, rng)
        return "kill_worker"

    async def kill_server() -> str:
        return await cluster.kill_server()

    async def pause_one() -> str:
        length, seconds = rng.choice([("short", short), ("long", long)])
        alive = [w for w in cluster.workers if w.alive]
        if alive and rng.random() < 0.7:
            await pause(rng.choice(alive).proc, seconds)
            return f"pause_worker_{length}"
        await pause(cluster.server.proc, seconds)
        return f"pause_server_{length}"

    async def cut() -> str:
        if rng.random() < 0.5:
            cluster.proxy.cut()
            return "cut_connections"
        length, seconds = rng.choice([("short", short), ("long", long)])
        await cluster.proxy.stall(seconds)
        return f"stall_connections_{length}"

    async def disk_full() -> str:
        assert fill_disk is not None
        return await fill_disk(rng.uniform(0.5, 3.0))

    optional = [
        ("restart_postgres", postgres_restart_every, restart_postgres),
        ("disk_full", disk_full_every, disk_full if fill_disk is not None else None),
        ("cut_database", database_cut_every, cut_database),
    ]

    return [
        f
        for f in [
            Fault("kill_worker", worker_kill_every, kill_worker),
            Fault("kill_server", server_kill_every, kill_server),
            Fault("pause", pause_every, pause_one),
            Fault("cut", cut_every, cut),
        ]
        + [Fault(name, every, inject) for name, every, inject in optional if inject is not None]
        if f.every > 0
    ]


@dataclass
class Chaos:
    """Run every fault on its own loop until ``seconds`` passed or ``max_kills`` SIGKILLs
    were sent; ``counts`` says how many of each kind were injected."""

    faults: list[Fault]
    rng: random.Random
    seconds: float
    max_kills: int
    counts: Counter[str] = field(default_factory=Counter)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def kills(self) -> int:
        return sum(self.counts[k] for k in KILLS)

    async def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        loops = [asyncio.create_task(self._loop(f, deadline)) for f in self.faults]
        try:
            await asyncio.gather(*loops)
        finally:
            self.stopped.set()
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self, fault: Fault, deadline: float) -> None:
        while True:
            delay = fault.every * self.rng.uniform(0.5, 1.5)
            if time.monotonic() + delay >= deadline or self.kills >= self.max_kills:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), delay)
            if self.stopped.is_set() or self.kills >= self.max_kills:
                return
            self.counts[await fault.inject()] += 1
            if self.kills >= self.max_kills:
                self.stopped.set()  # wake the other loops: the bound is reached

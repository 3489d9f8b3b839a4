"""The soak on PostgreSQL: two nodes (one leads, one hot standby) on one database, and a
private PostgreSQL server that the soak may restart.

``PrivatePostgres`` makes a throwaway PostgreSQL cluster (``initdb`` into a temporary
directory, as the ``postgres`` user when run as root, on a free port of 127.0.0.1, with
PostgreSQL's durable defaults), so restarting it never touches a server that other tests
share. ``HaCluster`` runs the two nodes and the Workers; it is also their supervisor: a
node that exits (it stepped down: its lease was lost when PostgreSQL restarted or it was
paused past its session timeout, or cut off from PostgreSQL) is started again, as a
standby. With ``database_cuts``, each node reaches PostgreSQL through a ``TcpProxy`` of
its own, and ``cut_database`` cuts the leader's (silence, nothing closed, as behind a
partition: ``tests/e2e/test_network_cut.py``'s fault) until it stepped down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench.soak_chaos import Proxy, WorkerPool
from dex.testing import ServerProcess, WorkerProcess, free_port, wait_until
from dex.testing.proxy import TcpProxy

PG_BIN = Path("/usr/lib/postgresql")
LEADER_WAIT = 120.0
"""Seconds a fault waits for some node to lead (a node takes seconds to start)."""
CUT_WAIT = 30.0
"""Seconds a leader cut off from PostgreSQL has to step down (its lease is 3 s) before the
cut ends anyway and the soak counts it as a leader that did not step down."""


def _pg_tool(name: str) -> str:
    """A PostgreSQL server program: on PATH, or Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which(name)
    if found:
        return found
    for version in sorted(PG_BIN.glob("*/bin"), reverse=True):
        if (version / name).exists():
            return str(version / name)
    raise RuntimeError(
        f"{name} not found: install PostgreSQL's server (apt-get install postgresql)"
    )


class PrivatePostgres:
    """A PostgreSQL server of the soak's own: ``start``, ``restart`` (a fast shutdown, then
    a start: every connection is cut), ``stop`` (and its directory is removed)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dex-soak-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.restarts = 0
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/dex"

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = list(args)
        if self._user is not None:  # initdb and postgres refuse to run as root
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        if self._user is not None:
            user = pwd.getpwnam(self._user)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            _pg_tool("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        self._pg_ctl("start")
        self._run(
            _pg_tool("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "dex"
        )

    def _pg_ctl(self, action: str, *more: str) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c max_connections=100"
        )
        self._run(
            _pg_tool("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            *more,
            action,
        )

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")
        self.restarts += 1

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Proxies:
    """Cut or stall the Worker connections to every node at once."""

    def __init__(self, proxies: list[Proxy]) -> None:
        self.proxies = proxies

    def cut(self) -> int:
        return sum(p.cut() for p in self.proxies)

    async def stall(self, seconds: float) -> None:
        await asyncio.gather(*(p.stall(seconds) for p in self.proxies))


@dataclass
class HaCluster(WorkerPool):
    """Two nodes on one PostgreSQL database, Workers behind a proxy to each, and the
    supervisor that starts a node again when it exits."""

    directory: Path
    ledger: Path
    workers_wanted: int
    heartbeat_timeout: float
    reconnect_grace: float
    database: str
    postgres: PrivatePostgres | None = None
    database_cuts: bool = False
    """Each node reaches PostgreSQL through a proxy of its own, which ``cut_database`` cuts."""
    nodes: list[ServerProcess] = field(init=False)
    proxies: list[Proxy] = field(init=False)
    database_proxies: list[TcpProxy] = field(init=False)
    workers: list[WorkerProcess] = field(default_factory=list)
    started_workers: int = 0
    slow_takeovers: int = 0
    """Leader kills after which no node led within ``LEADER_WAIT``."""
    restarts: int = 0
    """Nodes started again by the supervisor: SIGKILLed leaders, and nodes that stepped
    down by themselves (their lease was lost)."""
    takeovers: list[float] = field(default_factory=list)
    """Seconds from a leader's SIGKILL to the standby serving, when the standby was up
    (it answered ``/healthz``) at the kill: what the hot standby promises."""
    cold_takeovers: list[float] = field(default_factory=list)
    """The same when the other node was itself still starting at the kill (the
    supervisor had just started it again): its start-up is in the figure."""
    cut_step_downs: list[float] = field(default_factory=list)
    """Seconds from cutting the leader off from PostgreSQL to its exit with status 4."""
    cut_takeovers: list[float] = field(default_factory=list)
    """Seconds from the cut to a node serving again (after the cut leader left)."""
    cuts_not_stepped_down: list[str] = field(default_factory=list)
    """Cut leaders that did not exit with status 4 within ``CUT_WAIT``: how each ended."""
    _supervisor: asyncio.Task[None] | None = None
    _active: int = 0
    _threads: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        env = {"DEX_RECONNECT_GRACE": str(self.reconnect_grace)}
        db = urlsplit(self.database)
        assert db.hostname is not None and db.port is not None
        self.database_proxies = (
            [TcpProxy(db.hostname, db.port) for _ in range(2)] if self.database_cuts else []
        )
        urls = [
            self.database.replace(f":{db.port}/", f":{proxy.port}/")
            for proxy in self.database_proxies
        ] or [self.database] * 2
        self.nodes = [
            ServerProcess(
                self.directory / name,
                heartbeat_timeout=self.heartbeat_timeout,
                env=env,
                database=url,
                standby=True,
            )
            for name, url in zip(("node-a", "node-b"), urls, strict=True)
        ]
        self.proxies = [Proxy(node.port) for node in self.nodes]

    @property
    def proxy(self) -> Proxies:
        return Proxies(self.proxies)

    @property
    def server(self) -> ServerProcess:
        """The node that led at the last look (the one a pause fault stops)."""
        return self.nodes[self._active]

    @property
    def address(self) -> str:
        return ",".join(node.address for node in self.nodes)

    async def start(self) -> None:
        for database_proxy in self.database_proxies:
            self._threads.enter_context(database_proxy.in_thread())
        await asyncio.to_thread(self.nodes[0].start)
        await asyncio.to_thread(self.nodes[1].start, ready=False)
        for proxy in self.proxies:
            await proxy.start()
        for _ in range(self.workers_wanted):
            self.start_worker()
        self._supervisor = asyncio.create_task(self._supervise())

    @property
    def worker_address(self) -> str:
        return ",".join(proxy.address for proxy in self.proxies)

    def _leader(self) -> int | None:
        for i, node in enumerate(self.nodes):
            if node.alive and node.ready():
                self._active = i
                return i
        return None

    def _wait_leader(self) -> int | None:
        """The node that leads, waiting up to ``LEADER_WAIT`` for one; None if none does."""
        try:
            wait_until(lambda: self._leader() is not None, LEADER_WAIT, 0.05, "a node leads")
        except TimeoutError:
            return None
        return self._active

    async def kill_server(self) -> str:
        """SIGKILL the leader and wait until a node serves again (the standby takes over);
        the supervisor starts the killed node again, as the standby."""
        leader = await asyncio.to_thread(self._wait_leader)
        if leader is None:
            return "no_leader_to_kill"  # nodes still starting (a busy machine): counted
        standby = self.nodes[1 - leader]
        hot = await asyncio.to_thread(lambda: standby.alive and standby.answers())
        node = self.nodes[leader]
        assert node.proc is not None
        # The signal goes now, from the loop: a kill queued behind the soak's other
        # blocking calls in the default executor would count its wait as the takeover's.
        node.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(node.kill)  # reap it
        if await asyncio.to_thread(self._wait_leader) is None:
            self.slow_takeovers += 1
        (self.takeovers if hot else self.cold_takeovers).append(time.monotonic() - killed)
        return "kill_leader"

    async def cut_database(self) -> str:
        """Cut the leader off from PostgreSQL (silence both ways, nothing closed) until it
        steps down (exits, status 4) or ``CUT_WAIT`` passed, then let its new connections
        through again; the supervisor starts it again as the standby."""
        leader = await asyncio.to_thread(self._wait_leader)
        if leader is None:
            return "no_leader_to_cut"
        node, link = self.nodes[leader], self.database_proxies[leader]
        proc = node.proc  # the supervisor replaces node.proc once this one exits
        assert proc is not None
        link.cut()
        cut = time.monotonic()
        left: float | None = None
        try:
            while left is None and time.monotonic() - cut < CUT_WAIT:
                await asyncio.sleep(0.05)
                if proc.poll() is not None:
                    left = time.monotonic() - cut
        finally:
            link.restore()
        if left is None:
            self.cuts_not_stepped_down.append(f"still running {CUT_WAIT:g} s after the cut")
        elif proc.returncode != 4:  # another fault (a SIGKILL) ended it first
            self.cuts_not_stepped_down.append(f"exited with status {proc.returncode}")
        else:
            self.cut_step_downs.append(left)
        if await asyncio.to_thread(self._wait_leader) is not None:
            self.cut_takeovers.append(time.monotonic() - cut)
        return "cut_database"

    async def restart_postgres(self) -> str:
        assert self.postgres is not None
        await asyncio.to_thread(self.postgres.restart)
        return "restart_postgres"

    async def _supervise(self) -> None:
        """Start again every node that is not running (it stepped down, or a fault killed
        it), as a standby: the only place nodes are started after the first start."""
        while True:
            await asyncio.sleep(0.2)
            for node in self.nodes:
                if node.proc is not None and not node.alive:
                    self.restarts += 1
                    await asyncio.to_thread(node.kill)  # reap it
                    await _start(node)

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for worker in self.workers:
            await asyncio.to_thread(worker.kill)
        for node in self.nodes:
            await asyncio.to_thread(node.kill)
        for proxy in self.proxies:
            await proxy.close()
        self._threads.close()

    def logs(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))


async def _start(node: ServerProcess) -> None:
    """Start a node as a standby; one that cannot start now (PostgreSQL restarting) is
    left for the supervisor's next look."""
    try:
        await asyncio.to_thread(node.start, ready=False)
    except (RuntimeError, TimeoutError):
        pass

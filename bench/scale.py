"""Scale of stored work: a restart with many stored sessions, paging through them, and
how fast sessions are created, with a smaller baseline measured in the same run.

    .venv/bin/python -m bench.scale                            # 1,000,000 sessions
    .venv/bin/python -m bench.scale --sessions 100000 --baseline 10000
    .venv/bin/python -m bench.scale --database postgresql      # on a fresh PostgreSQL database

For each size (the baseline, then ``--sessions``) it runs in a fresh temporary directory:

1. A Dex Server (its durable defaults) and a Worker serving ``bench/scale_agents.py``.
   One template session runs one real turn; the server stops.
2. The idle sessions are bulk copies of that template, written straight into the
   database (same rows, new ids): a stored session that had one turn.
3. The server starts on them; ``--mid-turn`` sessions (1,000) are created through the
   API and each sends a message whose tool blocks in its first attempt, so every one of
   them is in a real turn with an attempt running on the Worker.
4. SIGKILL of the server, and a restart on the same data; the Worker stays up and
   reconnects. Timed from the new process's start: ``/readyz`` answering 200; every
   mid-turn session's tool starting its second attempt (the tool's own ledger: the
   first attempt failed as the restart must, and the retry was handed out); every one
   of those turns completed. Repeated ``--restarts`` times (fresh mid-turn sessions each
   time) for the spread.
5. The server's RSS after the restart, then after reading snapshots of ``--touch``
   idle sessions and running a turn in ``--touch-turns`` of them: bounded memory means
   these figures do not follow the count of stored sessions.
6. ``GET /v1/sessions`` pages (``--page`` sessions each) at the first page, the middle
   and the end: wall time and server CPU per page.
7. Session creation through the HTTP API by ``--clients`` concurrent clients
   (``bench.creator``: one keep-alive connection each, lighter than ``dex.Client``) for
   ``--create-seconds``: creations per second, and CPU per creation
   of the server and of this client process. The machine's cores are shared by both, so
   the server's CPU per creation is the figure that carries to another machine.

The temporary directories are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dex
from dex.server.fleet import encode_cursor
from dex.testing import ServerProcess, WorkerProcess, wait_until, wait_until_async

from . import creator
from .turns import cpu_seconds, machine_busy_seconds, memory_kib, render_table

AGENTS = str(Path(__file__).with_name("scale_agents.py"))
AGENT = "scale"
TEMPLATE = "template-session-0000"
HEARTBEAT_TIMEOUT = 10.0
TARGET_READY_S = 2.0
TARGET_RECOVERED_S = 5.0
TARGET_CREATIONS_PER_S = 10_000.0
BULK_CHUNK = 50_000
NUMBER = r"\d[\d,]*"
TABLES = {
    "sessions": "id",
    "history": "session_id",
    "turns": "session_id",
    "steps": "session_id",
    "calls": "session_id",
    "messages": "session_id",
}
"""The tables that hold a session's rows, and the column naming it."""


@dataclass
class Restart:
    ready: float
    """Seconds from the new process's start to ``/readyz`` 200."""
    reconnected: float
    """... to the Worker connected again (its own reconnect backoff)."""
    recovered: float
    """... to every mid-turn session's second attempt started (the tool's ledger)."""
    completed: float
    """... to every mid-turn turn completed."""
    cpu_ready: float
    """The server's CPU seconds until it was ready (imports, start, recovery)."""
    cpu_recovered: float
    """... until every mid-turn tool's second attempt started."""
    rss_ready_kib: int
    commits: int
    """Durable commits the node made until it was ready (its recovery)."""
    failed_turns: int


@dataclass
class Size:
    sessions: int
    bulk_seconds: float = 0.0
    database_mib: float = 0.0
    empty_ready: tuple[float, float] = (0.0, 0.0)
    """Seconds from start to ready, and CPU seconds, on an empty database."""
    idle_ready: tuple[float, float] = (0.0, 0.0)
    """Seconds from start to ready on the idle sessions alone (none mid-turn)."""
    restarts: list[Restart] = field(default_factory=list)
    rss_touched_kib: list[tuple[str, int]] = field(default_factory=list)
    pages: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Position -> (median wall seconds per page, server CPU seconds per page)."""
    created: int = 0
    create_seconds: float = 0.0
    create_cpu: dict[str, float] = field(default_factory=dict)
    create_errors: int = 0

    @property
    def creations_per_s(self) -> float:
        return self.created / self.create_seconds if self.create_seconds else 0.0


# --- the database, straight -----------------------------------------------------------


class Database:
    """Reads the template's rows and bulk-writes copies, for one backend."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _sqlite(self) -> sqlite3.Connection:
        return sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)

    def template(self) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
        """Every row that holds the template session, by table: its columns and rows. Read
        whole, so the copies follow whatever columns the schema has."""
        found: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
        if self.url.startswith("sqlite"):
            conn = self._sqlite()
            try:
                for table, key in TABLES.items():
                    cur = conn.execute(f"SELECT * FROM {table} WHERE {key} = ?", (TEMPLATE,))
                    found[table] = ([d[0] for d in cur.description], cur.fetchall())
            finally:
                conn.close()
            return found
        import psycopg

        with psycopg.connect(self.url) as pg:
            for table, key in TABLES.items():
                read = pg.execute(f"SELECT * FROM {table} WHERE {key} = %s", (TEMPLATE,))
                assert read.description is not None
                found[table] = ([str(d[0]) for d in read.description], read.fetchall())
        return found

    def copy(self, ids: list[str]) -> None:
        """Write a copy of every row of the template under each id (the id replaced in
        every text value: the state's, its calls' idempotency keys)."""
        template = self.template()
        chunks = (ids[i : i + BULK_CHUNK] for i in range(0, len(ids), BULK_CHUNK))
        mark = "?" if self.url.startswith("sqlite") else "%s"

        def rows(chunk: list[str]) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
            for table, (columns, found) in template.items():
                if not found:
                    continue
                insert = (
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join([mark] * len(columns))})"
                )
                yield (
                    insert,
                    [
                        tuple(v.replace(TEMPLATE, i) if isinstance(v, str) else v for v in row)
                        for i in chunk
                        for row in found
                    ],
                )

        if self.url.startswith("sqlite"):
            conn = self._sqlite()
            try:
                for chunk in chunks:
                    conn.execute("BEGIN")
                    for statement, params in rows(chunk):
                        conn.executemany(statement, params)
                    conn.execute("COMMIT")
            finally:
                conn.close()
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as pg:
            for chunk in chunks:
                with pg.transaction(), pg.cursor() as cur:
                    for statement, params in rows(chunk):
                        cur.executemany(statement, params)

    def size_mib(self, data_dir: Path) -> float:
        if self.url.startswith("sqlite"):
            return sum(p.stat().st_size for p in data_dir.glob("dex.sqlite3*")) / 2**20
        import psycopg

        with psycopg.connect(self.url) as pg:
            row = pg.execute("SELECT pg_database_size(current_database())").fetchone()
        return float(row[0]) / 2**20 if row else 0.0


# --- helpers -----------------------------------------------------------------------------


def ledger(directory: Path) -> list[dict[str, Any]]:
    path = directory / "starts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def started(directory: Path, sessions: set[str], attempt: int) -> int:
    return len({s["session"] for s in ledger(directory) if s["attempt"] == attempt} & sessions)


async def gather_limited(n: int, jobs: list[Any]) -> list[Any]:
    room = asyncio.Semaphore(n)

    async def one(job: Any) -> Any:
        async with room:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


def rss_kib(server: ServerProcess) -> int:
    return memory_kib(server.pid, "VmRSS")


async def metrics(client: dex.Client, address: str) -> dict[str, float]:
    """The node's ``/metrics`` as name -> value (unlabelled samples)."""

    def read() -> str:
        with urllib.request.urlopen(address + "/metrics", timeout=10) as response:
            return str(response.read().decode())

    values: dict[str, float] = {}
    for line in (await asyncio.to_thread(read)).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


class Profiler:
    """``py-spy record`` of the server (``--profile``): attaches as soon as its process
    exists, and stops (SIGINT, py-spy then writes its file) on ``finish``."""

    def __init__(self, server: ServerProcess, output: Path) -> None:
        self.output = output
        self.spy: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._attach, args=(server,), daemon=True)
        self._thread.start()

    def _attach(self, server: ServerProcess) -> None:
        wait_until(lambda: server.proc is not None, 120, 0.001, "the server spawned")
        assert server.proc is not None
        exe = str(Path(sys.executable).with_name("py-spy"))
        self.spy = subprocess.Popen(
            [
                *(exe, "record", "--pid", str(server.proc.pid), "--rate", "250"),
                *("--threads", "--nonblocking", "--format", "raw", "--output", str(self.output)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def finish(self) -> None:
        self._thread.join()
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(30)


class Run:
    """One size: the processes and the data of one temporary directory."""

    def __init__(self, args: argparse.Namespace, directory: Path, url: str | None) -> None:
        self.args = args
        self.directory = directory
        env = {"DEX_BENCH_DIR": str(directory)}
        self.server = ServerProcess(
            directory / "data", heartbeat_timeout=HEARTBEAT_TIMEOUT, env=env, database=url
        )
        self.url = url or f"sqlite:///{directory / 'data' / 'dex.sqlite3'}"
        self.database = Database(self.url)
        self.worker = WorkerProcess(
            AGENTS, self.server.address, directory / "worker.log", env=env, capacity=4096
        )
        self.ids: list[str] = []
        self.mid_turn: set[str] = set()
        self.size = 0

    def start_server(self) -> tuple[float, float]:
        """Start the server: seconds until it answered ``/readyz`` 200, and its CPU seconds
        by then."""
        t0 = time.monotonic()
        self.server.start(timeout=120)
        return time.monotonic() - t0, cpu_seconds(self.server.pid)

    async def worker_connected(self, client: dex.Client) -> None:
        async def connected() -> bool:
            if not self.worker.alive:
                raise RuntimeError(f"the Worker exited:\n{self.worker.output()[-3000:]}")
            return any(a["name"] == AGENT for w in await client.list_workers() for a in w["agents"])

        await wait_until_async(connected, 30, 0.02, "the Worker connected")

    async def start_mid_turn(self, client: dex.Client) -> set[str]:
        """Create ``--mid-turn`` sessions, each in a turn whose tool blocks on the Worker."""
        n = self.args.mid_turn

        async def one() -> str:
            session = str((await client.create_session(AGENT))["id"])
            await client.send_message(session, "hold", message_id="hold")  # retried if slow
            return session

        sessions = set(await gather_limited(64, [one() for _ in range(n)]))
        await asyncio.to_thread(
            wait_until,
            lambda: started(self.directory, sessions, 1) == n,
            60,
            0.02,
            "every mid-turn tool started",
        )
        return sessions

    async def restart(self, client: dex.Client, sessions: set[str], label: str) -> Restart:
        """SIGKILL the server and start it again; time ready, recovered, completed."""
        n = len(sessions)
        self.server.kill()
        t0 = time.monotonic()
        profiler = self.profile_start(f"restart-{label}")
        self.server.start(timeout=120)
        ready = time.monotonic() - t0
        cpu_ready = cpu_seconds(self.server.pid)
        rss = rss_kib(self.server)
        commits = (await metrics(client, self.server.address))["dex_store_commits_total"]
        await self.worker_connected(client)
        reconnected = time.monotonic() - t0
        wait_until(
            lambda: started(self.directory, sessions, 2) == n,
            120,
            0.01,
            "every mid-turn tool's second attempt started",
        )
        recovered = time.monotonic() - t0
        cpu_recovered = cpu_seconds(self.server.pid)

        async def completed(session: str) -> bool:
            turn = await client.wait_turn(session, 1, timeout=60)
            return bool(turn["status"] == "completed")

        done = await gather_limited(256, [completed(s) for s in sessions])
        total = time.monotonic() - t0
        if profiler is not None:
            profiler.finish()
        return Restart(
            ready=ready,
            reconnected=reconnected,
            recovered=recovered,
            completed=total,
            cpu_ready=cpu_ready,
            cpu_recovered=cpu_recovered,
            rss_ready_kib=rss,
            commits=int(commits),
            failed_turns=done.count(False),
        )

    def profile_start(self, name: str) -> Profiler | None:
        """py-spy on the server from its start (``--profile``), in a thread of its own: the
        server is spawned by ``ServerProcess.start``, which returns once it is ready."""
        if self.args.profile is None:
            return None
        self.server.proc = None
        return Profiler(self.server, self.args.profile / f"server-{self.size}-{name}.txt")

    async def touch(self, client: dex.Client, size: Size) -> None:
        """Read snapshots of many idle sessions, then run a turn in some: RSS after each."""
        rng = random.Random(7)
        picks = rng.sample(self.ids, min(len(self.ids), self.args.touch))
        half = len(picks) // 2
        for label, chunk in (("read half", picks[:half]), ("read all", picks[half:])):
            await gather_limited(64, [client.get_agent_snapshot(s) for s in chunk])
            size.rss_touched_kib.append((f"{label} ({len(chunk):,} more)", rss_kib(self.server)))
        turns = rng.sample(self.ids, min(len(self.ids), self.args.touch_turns))

        async def turn(session: str) -> None:
            result = await client.send_message(
                session, "hi", message_id="touch", wait=True, timeout=60
            )
            assert result["status"] == "completed", result

        await gather_limited(64, [turn(s) for s in turns])
        size.rss_touched_kib.append((f"turns in {len(turns):,}", rss_kib(self.server)))

    async def pages(self, client: dex.Client, size: Size) -> None:
        # newest first: the copies share the template's creation time, so among them the
        # order is by id, descending; a cursor points after a (time, id)
        created = (await client.get_agent_snapshot(TEMPLATE))["session"]["created_at"]
        copies = sorted([*self.ids, TEMPLATE], reverse=True)
        positions = {
            "first": None,
            "middle": encode_cursor("created", created, copies[len(copies) // 2]),
            "end": encode_cursor(
                "created", created, copies[max(0, len(copies) - self.args.page - 1)]
            ),
        }
        walls: dict[str, list[float]] = {name: [] for name in positions}
        cpu = dict.fromkeys(positions, 0.0)
        block = 10  # positions take turns, block by block: the machine's noise hits each alike
        for _ in range(max(1, self.args.page_samples // block)):
            for name, after in positions.items():
                cpu0 = cpu_seconds(self.server.pid)
                for _ in range(block):
                    t0 = time.perf_counter()
                    page = await client.list_sessions(limit=self.args.page, cursor=after)
                    walls[name].append(time.perf_counter() - t0)
                    assert len(page["sessions"]) == self.args.page, (name, page)
                cpu[name] += cpu_seconds(self.server.pid) - cpu0
        for name in positions:
            size.pages[name] = (statistics.median(walls[name]), cpu[name] / len(walls[name]))

    async def create(self, size: Size) -> None:
        address, clients = self.server.address, self.args.clients
        await creator.create(address, AGENT, clients=clients, seconds=1.0)  # warm-up
        profiler = (
            Profiler(self.server, self.args.profile / f"server-{self.size}-create.txt")
            if self.args.profile is not None
            else None
        )
        cpu0 = self.cpu()
        t0 = time.monotonic()
        tally = await creator.create(
            address, AGENT, clients=clients, seconds=self.args.create_seconds
        )
        size.create_seconds = time.monotonic() - t0
        cpu1 = self.cpu()
        if profiler is not None:
            profiler.finish()
        size.created = tally.created
        size.create_errors = tally.failed
        size.create_cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}

    def cpu(self) -> dict[str, float]:
        return {
            "server": cpu_seconds(self.server.pid),
            "client": time.process_time(),
            "worker": cpu_seconds(self.worker.pid),
            "machine": machine_busy_seconds(),
        }

    async def run(self, n: int) -> Size:
        size = Size(n)
        self.size = n
        print(f"[{n:,} sessions] template turn ...", flush=True)
        size.empty_ready = self.start_server()
        self.worker.start()
        async with dex.Client(self.server.address, timeout=60, connections=300) as client:
            await self.worker_connected(client)
            await client.create_session(AGENT, TEMPLATE)
            turn = await client.send_message(TEMPLATE, "hi", wait=True)
            assert turn["status"] == "completed", turn
            self.server.kill()

            idle = n - 1 - self.args.mid_turn * self.args.restarts
            rng = random.Random(n)
            self.ids = [f"s_{rng.getrandbits(64):016x}" for _ in range(idle)]
            print(f"[{n:,} sessions] writing {idle:,} idle sessions ...", flush=True)
            t0 = time.monotonic()
            self.database.copy(self.ids)
            size.bulk_seconds = time.monotonic() - t0
            size.database_mib = self.database.size_mib(self.directory / "data")
            size.idle_ready = self.start_server()
            await self.worker_connected(client)

            for r in range(self.args.restarts):
                print(f"[{n:,} sessions] restart {r + 1}/{self.args.restarts} ...", flush=True)
                sessions = await self.start_mid_turn(client)
                self.mid_turn |= sessions
                size.restarts.append(await self.restart(client, sessions, str(r + 1)))
                await self.worker_connected(client)

            print(f"[{n:,} sessions] touching idle sessions ...", flush=True)
            await self.touch(client, size)
            print(f"[{n:,} sessions] list pages ...", flush=True)
            await self.pages(client, size)
            print(f"[{n:,} sessions] creating sessions ...", flush=True)
            await self.create(size)
        return size

    def stop(self) -> None:
        for proc in (self.worker, self.server):
            if proc.alive:
                proc.kill()


# --- the report ------------------------------------------------------------------------


def spread(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    if not values:
        return "-"
    v = sorted(x * scale for x in values)
    if len(v) == 1:
        return f"{v[0]:.2f} {unit}"
    return f"{statistics.median(v):.2f} {unit} ({v[0]:.2f}-{v[-1]:.2f})"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(sizes: list[Size], args: argparse.Namespace) -> str:
    base, big = sizes[0], sizes[-1]
    backend = args.database
    out = [
        "",
        f"Dex scale benchmark: {backend}, {os.cpu_count()} CPUs, durable defaults;",
        f"  idle sessions: copies of a session that ran one turn; {args.mid_turn:,} sessions "
        f"mid-turn (a tool blocking on the Worker) at each of {args.restarts} SIGKILLs.",
        "",
    ]
    header = ["", *(f"{s.sessions:,} sessions" for s in sizes)]
    if len(sizes) > 1:
        header.append("ratio")

    def row(name: str, values: list[float], fmt: str = "{:.2f}", unit: str = "") -> list[str]:
        cells = [name, *(fmt.format(v) + unit for v in values)]
        if len(sizes) > 1:
            cells.append(ratio(values[-1], values[0]))
        return cells

    def med(size: Size, attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in size.restarts))

    def timed(name: str, attr: str) -> list[str]:
        cells = [name, *(spread([getattr(r, attr) for r in s.restarts]) for s in sizes)]
        if len(sizes) > 1:
            cells.append(ratio(med(big, attr), med(base, attr)))
        return cells

    rows = [
        row("database size", [s.database_mib for s in sizes], "{:.0f}", " MiB"),
        row("bulk write of the idle sessions", [s.bulk_seconds for s in sizes], "{:.1f}", " s"),
        row("start to ready, empty database", [s.empty_ready[0] for s in sizes], unit=" s"),
        row("  server CPU until ready", [s.empty_ready[1] for s in sizes], unit=" s"),
        row("start to ready, idle sessions only", [s.idle_ready[0] for s in sizes], unit=" s"),
        row("  server CPU until ready", [s.idle_ready[1] for s in sizes], unit=" s"),
        timed("SIGKILL restart: start to ready", "ready"),
        timed("  to the Worker reconnected", "reconnected"),
        timed(f"  to {args.mid_turn:,} tools retried", "recovered"),
        timed(f"  to {args.mid_turn:,} turns completed", "completed"),
        timed("  server CPU until ready", "cpu_ready"),
        timed(f"  server CPU until {args.mid_turn:,} tools retried", "cpu_recovered"),
        row(
            "  commits until ready",
            [statistics.median(r.commits for r in s.restarts) for s in sizes],
            "{:.0f}",
        ),
        row(
            "server RSS after restart",
            [statistics.median(r.rss_ready_kib for r in s.restarts) / 1024 for s in sizes],
            "{:.0f}",
            " MiB",
        ),
    ]
    for i in range(len(base.rss_touched_kib)):
        label = _merged([s.rss_touched_kib[i][0] for s in sizes])
        rows.append(
            row(
                f"  after {label}",
                [s.rss_touched_kib[i][1] / 1024 for s in sizes],
                "{:.0f}",
                " MiB",
            )
        )
    for name in base.pages:
        rows.append(
            row(
                f"list page ({args.page}) at the {name}: wall",
                [s.pages[name][0] * 1e3 for s in sizes],
                unit=" ms",
            )
        )
        rows.append(row("  server CPU", [s.pages[name][1] * 1e3 for s in sizes], unit=" ms"))
    rows += [
        row(f"creations/s, {args.clients} clients", [s.creations_per_s for s in sizes], "{:.0f}"),
        row(
            "  server CPU per creation",
            [s.create_cpu["server"] / max(s.created, 1) * 1e6 for s in sizes],
            "{:.0f}",
            " us",
        ),
        row(
            "  client CPU per creation",
            [s.create_cpu["client"] / max(s.created, 1) * 1e6 for s in sizes],
            "{:.0f}",
            " us",
        ),
        row(
            "  server-bound rate (1 / server CPU)",
            [max(s.created, 1) / max(s.create_cpu["server"], 1e-9) for s in sizes],
            "{:.0f}",
            "/s",
        ),
        row(
            "  machine busy, not ours (CPUs)",
            [
                max(
                    0.0,
                    s.create_cpu["machine"]
                    - s.create_cpu["server"]
                    - s.create_cpu["client"]
                    - s.create_cpu["worker"],
                )
                / max(s.create_seconds, 1e-9)
                for s in sizes
            ],
        ),
    ]
    out.append(render_table(rows, header))
    failed = sum(r.failed_turns for s in sizes for r in s.restarts)
    errors = sum(s.create_errors for s in sizes)
    if failed or errors:
        out.append(
            f"  WARNING: {failed} mid-turn turns did not complete, {errors} creations failed"
        )
    ready = max(r.ready for r in big.restarts)
    recovered = max(r.recovered for r in big.restarts)
    pages = [big.pages[p][1] for p in big.pages]  # server CPU: wall time is the machine's
    server_rate = big.created / max(big.create_cpu["server"], 1e-9)
    out += [
        "",
        f"Targets at {big.sessions:,} sessions (worst of {len(big.restarts)} restarts)",
        _verdict(f"ready <= {TARGET_READY_S:g} s", ready <= TARGET_READY_S, f"{ready:.2f} s"),
        _verdict(
            f"{args.mid_turn:,} mid-turn sessions recovered <= {TARGET_RECOVERED_S:g} s",
            recovered <= TARGET_RECOVERED_S,
            f"{recovered:.2f} s",
        ),
        _verdict(
            "list page cost constant (server CPU per page, most/least <= 1.5)",
            max(pages) / max(min(pages), 1e-9) <= 1.5,
            " / ".join(f"{p * 1e3:.2f}" for p in pages) + " ms at the first / middle / end",
        ),
        _verdict(
            f"creations >= {TARGET_CREATIONS_PER_S:,.0f}/s",
            big.creations_per_s >= TARGET_CREATIONS_PER_S,
            f"{big.creations_per_s:,.0f}/s measured, {server_rate:,.0f}/s by server CPU",
        ),
    ]
    return "\n".join(out)


def _merged(labels: list[str]) -> str:
    """One row's name for the labels of each size, which differ in their counts only
    (``read half (3,499 more)``, ``read half (20,000 more)``): each count becomes the
    sizes' counts in turn (``read half (3,499 / 20,000 more)``)."""
    if len(set(labels)) == 1:
        return labels[0]
    counts = [re.findall(NUMBER, label) for label in labels]
    at = iter(zip(*counts, strict=True))
    return re.sub(NUMBER, lambda _: " / ".join(next(at)), labels[0])


def _verdict(what: str, ok: bool, value: str) -> str:
    return f"  {what}: {value}  {'MET' if ok else 'MISSED'}"


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=10_000, help="0: no baseline run")
    parser.add_argument("--mid-turn", type=int, default=1000)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--touch", type=int, default=40_000)
    parser.add_argument("--touch-turns", type=int, default=5_000)
    parser.add_argument("--page", type=int, default=100)
    parser.add_argument("--page-samples", type=int, default=300)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--create-seconds", type=float, default=5.0)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="py-spy the server during each restart and the creation phase into DIR "
        "(pip install py-spy)",
    )
    parser.add_argument(
        "--report", type=Path, default=None, metavar="FILE", help="write the figures as JSON"
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="where to create (and drop) the benchmark's database with --database postgresql",
    )
    args = parser.parse_args(argv)
    least = 1 + args.mid_turn * args.restarts + args.page + 1
    if args.sessions < least or (args.baseline and args.baseline < least):
        parser.error(f"--sessions and --baseline must be at least {least}")
    return args


async def measure(args: argparse.Namespace, n: int) -> Size:
    with tempfile.TemporaryDirectory(prefix="dex-scale-") as tmp, _database(args) as url:
        run = Run(args, Path(tmp), url)
        try:
            return await run.run(n)
        except BaseException:
            for proc, name in ((run.server, "server"), (run.worker, "worker")):
                if proc.proc is not None:
                    print(f"--- {name} log (tail) ---\n{proc.output()[-3000:]}", file=sys.stderr)
            raise
        finally:
            run.stop()


class _database:
    """A fresh PostgreSQL database for one size (``None`` for SQLite in the temp dir)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = f"dexscale_{os.getpid()}_{random.getrandbits(24)}"

    def __enter__(self) -> str | None:
        if self.args.database != "postgresql":
            return None
        import psycopg

        with psycopg.connect(self.args.postgres, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.name}")
        return str(self.args.postgres).rsplit("/", 1)[0] + "/" + self.name

    def __exit__(self, *exc: object) -> None:
        if self.args.database != "postgresql":
            return
        import psycopg

        with psycopg.connect(self.args.postgres, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [n for n in (args.baseline, args.sessions) if n]
    results = [asyncio.run(measure(args, n)) for n in sizes]
    print(report(results, args))
    if args.report is not None:
        args.report.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

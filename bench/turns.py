"""Turn throughput and latency of Dex on this machine, with baselines from the same run.

    .venv/bin/python -m bench.turns [--seconds 10] [--concurrency 1 64] [--profile DIR]

One turn is model -> one ``read`` tool -> model with no-op bodies (``bench/agents.py``):
three Steps. The Dex Server runs in its own process with its durable defaults
(SQLite WAL, ``synchronous=FULL``, group commit), the Worker in another (capacity
128), and the client (``dex.Client``) here. Each of N sessions sends its next message
when its previous turn ended (``send_message(wait=True)``).

Baselines measured in the same run, so the ratios hold on whatever machine runs this:
the in-process floor (the agent's model, tool and model functions called directly)
and one bare durable SQLite commit (WAL, ``synchronous=FULL``).

Everything lives in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

import dex
from dex.models import ModelRequest
from dex.testing import ServerProcess, WorkerProcess, wait_until_async
from dex.wire import AssistantItem, Item, ModelResponse, ToolResultItem, ToolSpec, UserItem

from . import agents

AGENT = agents.bench.name
STEPS_PER_TURN = 3
WORKER_CAPACITY = 128
# issue #10's targets, on a quiet machine
TARGET_SEQUENTIAL_P50_MS = 3.0
TARGET_CONCURRENT_TURNS_PER_S = 2500.0
TARGET_SERVER_CPU_MS = 0.4  # per turn, at TARGET_CONCURRENCY sessions
TARGET_CONCURRENCY = 64
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- baselines -----------------------------------------------------------------------


def commit_baseline(directory: Path, seconds: float = 1.0, at_most: int = 1000) -> list[float]:
    """Seconds per bare durable commit: one small INSERT, SQLite WAL, ``synchronous=FULL``."""
    path = directory / "commit-baseline.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        samples: list[float] = []
        stop = time.perf_counter() + seconds
        for i in range(at_most):
            t0 = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t (id, v) VALUES (?, ?)", (i, "x" * 200))
            conn.execute("COMMIT")
            samples.append(time.perf_counter() - t0)
            if i >= 50 and time.perf_counter() > stop:
                break
        return samples
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)


async def _run_model(agent: dex.Agent, history: list[Item], tools: list[ToolSpec]) -> ModelResponse:
    request = ModelRequest(
        session_id="floor",
        agent=agent.name,
        instructions=agent.instructions,
        history=history,
        tools=tools,
        attempt=1,
    )
    response: ModelResponse | None = None
    async for event in agent.model.stream(request):
        if isinstance(event, ModelResponse):
            response = event
    assert response is not None
    return response


async def inprocess_floor(
    turns_per_session: int, seconds: float = 1.0, at_most: int = 20000
) -> list[float]:
    """Seconds per turn when the same model, tool and model functions are called directly,
    with the history kept the same way (a fresh session every ``turns_per_session`` turns).
    The tools' specs are built once: they are the agent's definition, not the turn's work."""
    agent = agents.bench
    tools = [t.spec() for t in agent.all_tools()]
    samples: list[float] = []
    history: list[Item] = []
    stop = time.perf_counter() + seconds
    for i in range(at_most):
        if i % turns_per_session == 0:
            history = []
        t0 = time.perf_counter()
        history.append(UserItem(text="go"))
        first = await _run_model(agent, history, tools)
        history.append(AssistantItem(text=first.text, tool_calls=first.tool_calls))
        for model_call in first.tool_calls:
            tool = agent.tool(model_call.name)
            assert tool is not None
            ctx = dex.ToolContext(
                session_id="floor",
                call_id=model_call.id,
                tool=tool.name,
                idempotency_key=f"floor/{i}",
                attempt=1,
                _heartbeat=_no_heartbeat,
            )
            value = await tool.call(ctx, model_call.arguments)
            history.append(
                ToolResultItem(
                    call_id=model_call.id, name=tool.name, status="succeeded", result=value
                )
            )
        second = await _run_model(agent, history, tools)
        history.append(AssistantItem(text=second.text))
        assert second.text == "done" and not second.tool_calls
        samples.append(time.perf_counter() - t0)
        if i >= 100 and time.perf_counter() > stop:
            break
    return samples


async def _no_heartbeat() -> None:
    return None


# --- processes ------------------------------------------------------------------------


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU time a process, with its running child processes (the server's
    SQLite writer), or one of its threads has used so far."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return own if tid is not None else own + children_cpu_seconds(pid)


def children(pid: int) -> list[int]:
    """The running child processes of ``pid`` (the server's SQLite writer)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def children_cpu_seconds(pid: int) -> float:
    """CPU time the running child processes of ``pid`` have used so far."""
    total = 0.0
    for child in children(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(child)
    return total


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent not idle (nor waiting on I/O) so far."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS


def memory_kib(pid: int, key: str) -> int:
    """A ``Vm*`` line of /proc/<pid>/status (``VmHWM`` is the peak resident set), in KiB,
    with its running child processes' (the server's SQLite writer) added."""
    total = 0
    for process in [pid, *children(pid)]:
        with open(f"/proc/{process}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
    return total


async def metrics(http: aiohttp.ClientSession, address: str) -> dict[str, float]:
    async with http.get(address + "/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


class Profiler:
    """``py-spy record`` on a process for one phase (only with ``--profile``)."""

    def __init__(self, exe: str, pid: int, output: Path, seconds: float) -> None:
        self.output = output
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "250",
                "--nonblocking",
                "--threads",
                "--format",
                "raw",
                "--duration",
                str(max(1, round(seconds))),
                "--output",
                str(output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def finish(self) -> None:
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class ThreadProfile:
    name: str
    samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)


def read_profile(collapsed: Path) -> list[ThreadProfile]:
    """A py-spy raw file (one ``thread;frame;...;frame count`` line per stack) per thread,
    busiest thread first. Functions are aggregated over their lines."""
    threads: dict[str, ThreadProfile] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        thread, *frames = stack.split(";")
        if not frames:
            continue
        name = thread.rpartition(": ")[2] or thread
        profile = threads.setdefault(name, ThreadProfile(name))
        count = int(count_text)
        profile.samples += count
        names = [_frame(f) for f in frames]
        profile.own[names[-1]] += count
        for fn in set(names):
            profile.inclusive[fn] += count
    return sorted(threads.values(), key=lambda t: -t.samples)


def _frame(frame: str) -> str:
    """``fn (.../site-packages/pkg/mod.py:12)`` -> ``fn (pkg/mod.py)``; Dex's own files keep
    their path from ``dex/``."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    if not file:
        return name
    parts = Path(file).parts
    short = "/".join(parts[parts.index("dex") :] if "dex" in parts else parts[-2:])
    return f"{name} ({short})"


_ROOTS = {
    "<module>",
    "main",
    "server",
    "worker",
    "serve",
    "Worker.run_forever",
    "Worker.run",
    "SqliteStore._run",
}


# --- the measured phases --------------------------------------------------------------


@dataclass
class Phase:
    concurrency: int
    turns: int = 0
    failed: int = 0
    sessions_created: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    commits: float = 0.0
    operations: float = 0.0
    busy: float = float("nan")
    """Seconds the store's writer spent committing (``dex_store_busy_seconds_total``)."""
    cpu: dict[str, float] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return percentile(self.latencies, q)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class TurnClient(Protocol):
    """What a ``Lane`` needs of a client: ``dex.Client``, or ``bench.cluster``'s router."""

    async def create_session(self, agent: str, session_id: str | None = None) -> dict[str, Any]: ...

    async def send_message(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]: ...


class Lane:
    """One concurrent conversation: a session that sends its next message when its turn ends,
    and moves to a fresh session every ``turns_per_session`` turns (keeps history bounded)."""

    def __init__(self, client: TurnClient, turns_per_session: int) -> None:
        self.client = client
        self.turns_per_session = turns_per_session
        self.session: str | None = None
        self.used = 0

    async def run(self, until: float, phase: Phase | None) -> None:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            try:
                if self.session is None or self.used >= self.turns_per_session:
                    created = await self.client.create_session(AGENT)
                    self.session, self.used = created["id"], 0
                    if phase is not None:
                        phase.sessions_created += 1
                    t0 = time.perf_counter()
                self.used += 1
                turn = await self.client.send_message(self.session, "go", wait=True, timeout=30)
            except dex.DexError as e:
                if phase is not None:
                    phase.failed += 1
                    phase.errors[f"{type(e).__name__}: {e}"[:120]] += 1
                self.session = None
                await asyncio.sleep(0.05)
                continue
            elapsed = time.perf_counter() - t0
            if phase is None:
                continue
            if turn.get("status") == "completed" and turn.get("text") == "done":
                phase.turns += 1
                phase.latencies.append(elapsed)
            else:
                phase.failed += 1
                phase.errors[f"turn {turn.get('status')}: {turn.get('error')}"[:120]] += 1


async def run_phase(
    client: TurnClient,
    http: aiohttp.ClientSession,
    server: ServerProcess,
    worker: WorkerProcess,
    concurrency: int,
    seconds: float,
    warmup: float,
    turns_per_session: int,
    profile: tuple[str, Path] | None,
) -> Phase:
    lanes = [Lane(client, turns_per_session) for _ in range(concurrency)]
    await asyncio.gather(*(lane.run(time.perf_counter() + warmup, None) for lane in lanes))
    phase = Phase(concurrency)
    profilers: list[Profiler] = []
    if profile is not None:
        exe, directory = profile
        for name, pid in (("server", server.pid), ("worker", worker.pid)):
            output = directory / f"{name}-c{concurrency}.txt"
            profilers.append(Profiler(exe, pid, output, seconds))
    before = await metrics(http, server.address)
    cpu_before = _cpu(server, worker)
    start = time.perf_counter()
    await asyncio.gather(*(lane.run(start + seconds, phase) for lane in lanes))
    phase.seconds = time.perf_counter() - start
    cpu_after = _cpu(server, worker)
    after = await metrics(http, server.address)
    phase.commits = after["dex_store_commits_total"] - before["dex_store_commits_total"]
    phase.operations = after["dex_store_operations_total"] - before["dex_store_operations_total"]
    busy = "dex_store_busy_seconds_total"  # a baseline revision may not have it
    phase.busy = after.get(busy, float("nan")) - before.get(busy, float("nan"))
    phase.cpu = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
    for profiler in profilers:
        profiler.finish()
    return phase


def _cpu(server: ServerProcess, worker: WorkerProcess) -> dict[str, float]:
    return {
        "server": cpu_seconds(server.pid),  # with its writer process
        "server_loop": cpu_seconds(server.pid, server.pid),  # the event loop's thread
        "server_writer": children_cpu_seconds(server.pid),  # the SQLite writer process
        "worker": cpu_seconds(worker.pid),
        "client": time.process_time(),
        "machine": machine_busy_seconds(),
    }


# --- the report ---------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def render_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(lines)


def report(
    phases: list[Phase],
    floor: list[float],
    commit: list[float],
    peak_rss_kib: int,
    worker_peak_rss_kib: int,
    args: argparse.Namespace,
) -> str:
    floor_p50 = statistics.median(floor)
    commit_p50 = statistics.median(commit)
    out = [
        "",
        "Dex turn benchmark: model -> read tool -> model (3 Steps/turn), no-op bodies",
        f"  {os.cpu_count()} CPUs; Dex Server, Worker (capacity {WORKER_CAPACITY}) and client "
        "(dex.Client) in 3 processes on loopback;",
        "  SQLite WAL synchronous=FULL (the durable defaults, group commit); "
        f"{args.seconds:g} s per phase after {args.warmup:g} s warm-up;",
        f"  each session sends its next message when its turn ended (send_message(wait=True)) "
        f"and a fresh session is used every {args.turns_per_session} turns.",
        "",
        "Baselines (same run)",
        f"  in-process floor (model, tool, model called directly): p50 {floor_p50 * 1e6:.1f} us"
        f"/turn, mean {statistics.fmean(floor) * 1e6:.1f} us ({len(floor)} turns)",
        f"  bare durable commit (1 INSERT, WAL, synchronous=FULL): p50 {ms(commit_p50)} ms, "
        f"p99 {ms(percentile(commit, 99))} ms ({len(commit)} commits)",
        "",
    ]
    rows = []
    for p in phases:
        n = max(p.turns, 1)
        rows.append(
            [
                str(p.concurrency),
                str(p.turns),
                f"{p.turns_per_s:.0f}",
                f"{p.turns_per_s * STEPS_PER_TURN:.0f}",
                ms(p.pct(50)),
                ms(p.pct(99)),
                f"{p.pct(50) / floor_p50:.0f}x",
                f"{p.pct(50) / commit_p50:.1f}",
                f"{1 / max(p.turns_per_s, 1e-9) / commit_p50:.1f}",
                f"{p.commits / n:.2f}",
                f"{p.operations / n:.2f}",
                "-" if math.isnan(p.busy) else f"{p.busy / p.seconds:.0%}",
                "-" if math.isnan(p.busy) else ms(p.busy / max(p.operations, 1)),
            ]
        )
    header = ["sessions", "turns", "turns/s", "Steps/s", "p50 ms", "p99 ms"]
    header += ["p50/floor", "p50 in commits", "1/(turns/s) in commits"]
    header += ["commits/turn", "store ops/turn", "writer busy", "writer ms/op"]
    out.append(render_table(rows, header))
    out += [
        "",
        "  p50/floor: turn p50 over the in-process floor's p50. p50 in commits: turn p50 over",
        "  the bare durable commit's p50; 1/(turns/s) in commits: the same for the wall time",
        "  per turn at that throughput. commits/turn: dex_store_commits_total delta / turns;",
        "  store ops/turn: dex_store_operations_total delta / turns (each op is one transition",
        "  or read run by the store's writer process). Both include the session creations:",
        f"  one per {args.turns_per_session} turns. writer busy: the share of the phase the",
        "  store's one writer spent committing (dex_store_busy_seconds_total); near 100 % it",
        "  sets the pace, whatever CPU is left. writer ms/op: its wall time per op (compare",
        "  the CPU table's 'writer process').",
        "",
        "CPU per turn (ms of CPU time over the phase / turns) and machine load",
    ]
    rows = []
    for p in phases:
        n = max(p.turns, 1)
        ours = p.cpu["server"] + p.cpu["worker"] + p.cpu["client"]
        rows.append(
            [
                str(p.concurrency),
                ms(p.cpu["server"] / n),
                ms(p.cpu["server_loop"] / n),
                ms((p.cpu["server"] - p.cpu["server_loop"] - p.cpu["server_writer"]) / n),
                ms(p.cpu["server_writer"] / n),
                ms(p.cpu["worker"] / n),
                ms(p.cpu["client"] / n),
                ms(ours / n),
                f"{p.cpu['machine'] / p.seconds:.2f}",
                f"{max(0.0, p.cpu['machine'] - ours) / p.seconds:.2f}",
            ]
        )
    header = ["sessions", "server", "(loop", "other threads", "writer process)"]
    header += ["Worker", "client", "total"]
    header += ["machine busy, CPUs", "not ours, CPUs"]
    out.append(render_table(rows, header))
    noisy = [p for p in phases if (p.cpu["machine"] - _ours(p)) / p.seconds > 0.2]
    if noisy:
        out.append(
            "  WARNING: other processes used the CPUs during "
            + ", ".join(f"{p.concurrency}" for p in noisy)
            + " sessions: those figures are low; run again on a quiet machine."
        )
    if args.profile is not None:
        out.append("  (py-spy was sampling the server and Worker: every figure is lower.)")
    for p in phases:
        if p.failed:
            out.append(f"  {p.concurrency} sessions: {p.failed} turns FAILED: {dict(p.errors)}")
    out += [
        "",
        f"Server peak RSS (VmHWM, with its writer process): {peak_rss_kib / 1024:.1f} MiB   "
        f"(Worker: {worker_peak_rss_kib / 1024:.1f} MiB)",
        "",
        "Targets",
    ]
    by_c = {p.concurrency: p for p in phases}
    seq = by_c.get(1)
    if seq is None:
        out.append(f"  sequential turn p50 <= {TARGET_SEQUENTIAL_P50_MS:g} ms: not measured")
    else:
        ok = seq.pct(50) * 1000 <= TARGET_SEQUENTIAL_P50_MS and not seq.failed
        out.append(
            f"  sequential turn p50 <= {TARGET_SEQUENTIAL_P50_MS:g} ms: "
            f"{ms(seq.pct(50))} ms  {'MET' if ok else 'MISSED'}"
        )
    par = by_c.get(TARGET_CONCURRENCY)
    if par is None:
        out.append(
            f"  >= {TARGET_CONCURRENT_TURNS_PER_S:g} turns/s at {TARGET_CONCURRENCY} sessions: "
            "not measured"
        )
    else:
        ok = par.turns_per_s >= TARGET_CONCURRENT_TURNS_PER_S and not par.failed
        out.append(
            f"  >= {TARGET_CONCURRENT_TURNS_PER_S:g} turns/s at {TARGET_CONCURRENCY} sessions: "
            f"{par.turns_per_s:.0f} turns/s  {'MET' if ok else 'MISSED'}"
        )
        server_ms = par.cpu["server"] / par.turns * 1000 if par.turns else float("inf")
        ok = server_ms <= TARGET_SERVER_CPU_MS and not par.failed
        out.append(
            f"  server CPU per turn at {TARGET_CONCURRENCY} sessions "
            f"<= {TARGET_SERVER_CPU_MS:g} ms: {server_ms:.2f} ms  {'MET' if ok else 'MISSED'}"
        )
    return "\n".join(out)


def _ours(p: Phase) -> float:
    return p.cpu["server"] + p.cpu["worker"] + p.cpu["client"]


def profile_report(directory: Path, phases: list[Phase], n: int = 12) -> str:
    out = [
        "",
        f"Profiles (py-spy raw stacks in {directory}). Per thread: % of that thread's samples.",
        "  Time inside a C call (select, an SQLite statement, fsync, waiting for the GIL) counts",
        "  as its Python caller's own time.",
    ]
    for p in phases:
        for process in ("server", "worker"):
            path = directory / f"{process}-c{p.concurrency}.txt"
            if not path.exists():
                out.append(f"  {process} at {p.concurrency} sessions: no profile written")
                continue
            threads = read_profile(path)
            total = sum(t.samples for t in threads) or 1
            for t in threads:
                if t.samples < total / 10:
                    continue
                out += [
                    "",
                    f"  {process} at {p.concurrency} sessions, thread {t.name} "
                    f"({100 * t.samples / total:.0f}% of the samples)",
                    f"  {'own %':>6} {'incl %':>7}  busiest functions",
                ]
                for fn, count in t.own.most_common(n):
                    own, incl = 100 * count / t.samples, 100 * t.inclusive[fn] / t.samples
                    out.append(f"  {own:6.1f} {incl:7.1f}  {fn}")
                ours = [
                    (fn, c)
                    for fn, c in t.inclusive.most_common()
                    if "(dex/" in fn
                    or "/dex/" in fn
                    or fn.split(" (")[-1].startswith(
                        (
                            "server/",
                            "worker/",
                            "store/",
                            "api/",
                            "engine/",
                            "dispatch/",
                            "client/",
                            "models/",
                        )
                    )
                ]
                out.append(f"  {'':6} {'incl %':>7}  Dex functions")
                for fn, count in ours[:n]:
                    out.append(f"  {'':6} {100 * count / t.samples:7.1f}  {fn}")
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------


async def bench(
    args: argparse.Namespace, tmp: Path, agents_file: str, profile: tuple[str, Path] | None
) -> str:
    print("measuring the bare durable commit ...", flush=True)
    commit = commit_baseline(tmp)
    print("measuring the in-process floor ...", flush=True)
    await inprocess_floor(args.turns_per_session, seconds=0.2)  # warm-up
    floor = await inprocess_floor(args.turns_per_session)

    server = ServerProcess(tmp / "data")
    worker = WorkerProcess(
        agents_file, server.address, tmp / "worker.log", capacity=WORKER_CAPACITY
    )
    phases: list[Phase] = []
    with tailed_and_stopped(server, worker):
        print("starting the Dex Server and a Worker ...", flush=True)
        await asyncio.to_thread(server.start)
        worker.start()
        connections = max(args.concurrency) + 16
        async with (
            aiohttp.ClientSession() as http,
            dex.Client(server.address, connections=connections) as client,
        ):

            async def worker_ready() -> bool:
                if not worker.alive:
                    raise RuntimeError(f"the Worker exited:\n{worker.output()[-3000:]}")
                return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

            await wait_until_async(worker_ready, 20, 0.05, "the Worker connected")
            for concurrency in args.concurrency:
                print(
                    f"{concurrency} concurrent sessions: {args.warmup:g} s warm-up, "
                    f"{args.seconds:g} s measured ...",
                    flush=True,
                )
                phase = await run_phase(
                    client,
                    http,
                    server,
                    worker,
                    concurrency,
                    args.seconds,
                    args.warmup,
                    args.turns_per_session,
                    profile,
                )
                phases.append(phase)
        peak = memory_kib(server.pid, "VmHWM")
        worker_peak = memory_kib(worker.pid, "VmHWM")
    text = report(phases, floor, commit, peak, worker_peak, args)
    if profile is not None:
        text += "\n" + profile_report(profile[1], phases)
    return text


@contextlib.contextmanager
def tailed_and_stopped(server: ServerProcess, worker: WorkerProcess) -> Iterator[None]:
    """Print the tail of each process's log if the body fails; stop both at the end."""
    try:
        yield
    except BaseException:
        for proc, name in ((server, "server"), (worker, "worker")):
            if proc.proc is not None:
                print(f"--- {name} log (tail) ---\n{proc.output()[-2000:]}", file=sys.stderr)
        raise
    finally:
        _stop(worker)
        _stop(server)


def _stop(proc: WorkerProcess | ServerProcess) -> None:
    if not proc.alive:
        return
    try:
        proc.terminate(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.turns", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per phase (default 10)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, TARGET_CONCURRENCY],
        help="concurrent sessions, one phase each (default: 1 64)",
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="warm-up seconds before each phase (default 2)"
    )
    parser.add_argument(
        "--turns-per-session",
        type=int,
        default=20,
        help="turns before a lane moves to a fresh session, keeping history bounded (default 20)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the server and Worker with py-spy during each phase into DIR and print "
        "their top functions (py-spy is not a dependency: pip install py-spy)",
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0 or args.turns_per_session < 1:
        parser.error("--seconds must be > 0, --warmup >= 0, --turns-per-session >= 1")
    if any(c < 1 for c in args.concurrency):
        parser.error("--concurrency values must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile: tuple[str, Path] | None = None
    if args.profile is not None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        args.profile.mkdir(parents=True, exist_ok=True)
        profile = (exe, args.profile.resolve())
    agents_file = str(Path(agents.__file__).resolve())  # the Worker loads it by path
    with tempfile.TemporaryDirectory(prefix="dex-bench-") as tmp:
        text = asyncio.run(bench(args, Path(tmp), agents_file, profile))
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

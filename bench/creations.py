"""Session creations through the HTTP API: the server's CPU per creation and creations/s.

    .venv/bin/python -m bench.creations [--clients 64] [--seconds 3] [--rounds 5]
    .venv/bin/python -m bench.creations --baseline main     # interleaved against main
    .venv/bin/python -m bench.creations --profile DIR       # py-spy the server too
    .venv/bin/python -m bench.creations --stored 200000     # with many sessions stored

A Dex Server with its durable defaults (SQLite WAL, ``synchronous=FULL``, group commit)
and a Worker that registers the benchmark's agent; ``--clients`` keep-alive connections
(``bench.creator``, in this process) loop ``POST /v1/sessions``. Each round measures
the server's CPU (user + system, every thread, from ``/proc``) over ``--seconds`` of
creations. With ``--baseline REV`` a second server runs the code of that git revision
(a temporary worktree) beside the first, and the rounds alternate between the two, the
order swapped every round: the machine's neighbours load both alike, and the ratios of
the medians hold on a noisy machine. For a count that does not move with the load, see
``bench.instructions --turns 0 --concurrency 64 --creations 3000 --baseline REV``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from dex.testing import ServerProcess, WorkerProcess, wait_until_async

from . import agents, creator
from .instructions import baseline_tree
from .turns import cpu_seconds, machine_busy_seconds, metrics, render_table

AGENT = agents.bench.name
ROOT = Path(__file__).resolve().parent.parent
TARGET_PER_S = 10_000  # issue #10, item 3: at 64 clients


@dataclass
class Code:
    """One server under test, and what its rounds measured."""

    name: str
    server: ServerProcess
    worker: WorkerProcess
    rates: list[float] = field(default_factory=list)
    """Creations per second, per round."""
    cpu: list[float] = field(default_factory=list)
    """Server CPU seconds per creation, per round."""
    client: list[float] = field(default_factory=list)
    failed: int = 0


async def _connected(code: Code) -> None:
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            if not code.worker.alive:
                raise RuntimeError(f"the Worker exited:\n{code.worker.output()[-3000:]}")
            return (await metrics(http, code.server.address)).get("dex_workers_connected", 0) >= 1

        await wait_until_async(ready, 120, 0.05, f"the {code.name} Worker connected")


async def _round(code: Code, args: argparse.Namespace) -> None:
    pid = code.server.pid
    cpu0, client0, t0 = cpu_seconds(pid), time.process_time(), time.monotonic()
    tally = await creator.create(
        code.server.address, AGENT, clients=args.clients, seconds=args.seconds
    )
    wall = time.monotonic() - t0
    cpu, client = cpu_seconds(pid) - cpu0, time.process_time() - client0
    n = max(tally.created, 1)
    code.rates.append(tally.created / wall)
    code.cpu.append(cpu / n)
    code.client.append(client / n)
    code.failed += tally.failed


def _profile(code: Code, output: Path, seconds: float) -> subprocess.Popen[bytes]:
    exe = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [
            *(exe, "record", "--pid", str(code.server.pid), "--rate", "500"),
            *("--duration", str(max(1, round(seconds)))),
            *("--threads", "--nonblocking", "--format", "raw", "--output", str(output)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def bench(
    args: argparse.Namespace, tmp: Path, baseline: Path | None
) -> tuple[list[Code], float]:
    """The servers' rounds, and how many CPUs of the machine were busy during them."""
    trees: list[tuple[str, Path | None]] = [("current", None)]
    if baseline is not None:
        trees.append(("baseline", baseline / "src"))
    codes = []
    for name, src in trees:
        env = {"PYTHONPATH": str(src)} if src is not None else {}
        work = tmp / name
        work.mkdir()
        server = ServerProcess(work / "data", env=env, heartbeat_timeout=60)
        worker = WorkerProcess(
            str(ROOT / "bench" / "agents.py"), server.address, work / "worker.log", env=env
        )
        codes.append(Code(name, server, worker))
    try:
        for code in codes:
            await asyncio.to_thread(code.server.start, timeout=120)
            code.worker.start()
        for code in codes:
            await _connected(code)
            await creator.create(code.server.address, AGENT, clients=args.clients, seconds=1.0)
            if args.stored:
                print(f"  {code.name}: storing {args.stored:,} sessions first ...", flush=True)
                await creator.create(
                    code.server.address,
                    AGENT,
                    clients=args.clients,
                    seconds=float("inf"),
                    limit=args.stored,
                )
        busy0, t0 = machine_busy_seconds(), time.monotonic()
        for r in range(args.rounds):
            for code in codes if r % 2 == 0 else codes[::-1]:
                spy = None
                if args.profile is not None and r == 0:
                    spy = _profile(code, args.profile / f"server-{code.name}.txt", args.seconds)
                await _round(code, args)
                if spy is not None:
                    spy.wait(60)
                print(
                    f"  round {r + 1} {code.name}: {code.rates[-1]:,.0f}/s, server "
                    f"{code.cpu[-1] * 1e6:.0f} µs per creation",
                    flush=True,
                )
        busy = (machine_busy_seconds() - busy0) / (time.monotonic() - t0)
    finally:
        for code in codes:
            for proc in (code.worker, code.server):
                if proc.alive:
                    proc.kill()
    return codes, busy


def report(codes: list[Code], args: argparse.Namespace, busy: float) -> str:
    rows = []
    for code in codes:
        cpu = statistics.median(code.cpu)
        rows.append(
            [
                code.name,
                f"{statistics.median(code.rates):,.0f}",
                f"{min(code.rates):,.0f}-{max(code.rates):,.0f}",
                f"{cpu * 1e6:.0f}",
                f"{min(code.cpu) * 1e6:.0f}-{max(code.cpu) * 1e6:.0f}",
                f"{statistics.median(code.client) * 1e6:.0f}",
                f"{1 / cpu:,.0f}",
                str(code.failed),
            ]
        )
    if len(codes) == 2:
        new, old = codes
        rows.append(
            [
                "current/baseline",
                f"{statistics.median(new.rates) / statistics.median(old.rates):.2f}x",
                "",
                f"{statistics.median(new.cpu) / statistics.median(old.cpu):.2f}x",
                "",
                "",
                "",
                "",
            ]
        )
    headers = [
        "code",
        "creations/s",
        "(rounds)",
        "server µs",
        "(rounds)",
        "client µs",
        "server-bound/s",
        "failed",
    ]
    cpu = min(statistics.median(c.cpu) for c in codes)
    verdict = "MET" if max(statistics.median(c.rates) for c in codes) >= TARGET_PER_S else "MISSED"
    return "\n".join(
        [
            "",
            f"Session creations: {args.clients} clients (bench.creator), {args.rounds} rounds of "
            f"{args.seconds:g} s per server after {args.stored:,} stored, SQLite durable "
            f"defaults; medians (and each round's range); {os.cpu_count()} CPUs, "
            f"{busy:.2f} of them busy on average",
            "",
            render_table(rows, headers),
            "",
            "  server µs: the server process's CPU (every thread) per creation; server-bound/s:"
            " 1 / that, the rate with a core to itself.",
            f"  target: >= {TARGET_PER_S:,}/s at 64 clients: {verdict} (measured); "
            f"{TARGET_PER_S:,}/s needs <= {1e6 / TARGET_PER_S:.0f} µs of server CPU, the best "
            f"here is {cpu * 1e6:.0f} µs.",
        ]
    )


def run(args: argparse.Namespace, tmp: Path) -> str:
    with baseline_tree(args.baseline, tmp) as tree:
        codes, busy = asyncio.run(bench(args, tmp, tree))
    return report(codes, args, busy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.creations", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0, help="per round and server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument(
        "--stored",
        type=int,
        default=0,
        metavar="N",
        help="create N sessions in each server before the rounds (through the API)",
    )
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="py-spy each server's first round into DIR"
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        if shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None:
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dex-creations-") as tmp:
        print(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

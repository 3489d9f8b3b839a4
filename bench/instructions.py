"""Instructions per turn: the server's (and the Worker's) work, counted by callgrind.

    .venv/bin/python -m bench.instructions [--turns 200] [--concurrency 1 64]
    .venv/bin/python -m bench.instructions --baseline HEAD~5      # old against new, one run
    .venv/bin/python -m bench.instructions --creations 2000       # session creations too

CPU seconds mislead on a shared virtual machine: a process is charged for the time the
host ran something else on its CPU, so under load the same turn "costs" two or three
times as much. Instructions do not move with load. This benchmark runs the Dex Server
(and with ``--worker`` the Worker) under ``valgrind --tool=callgrind`` with
instrumentation off, warms up, then counts the instructions of every thread of the
process over a fixed number of turns (the turn of ``bench.turns``: model -> read tool ->
model) and prints them per turn. The server's SQLite writer is a process of its own, not
under callgrind: what it runs is not counted (against a revision from before 2026-12-06,
whose writer was a thread, compare with that in mind).

Under callgrind a process runs some 50 times slower, so at 64 sessions more work waits
for each group commit and each frame than it would at full speed: per-turn counts at
high concurrency are a lower bound. The sequential figure (1 session) has no such
effect. Compare figures of one run: ``--baseline REV`` measures the code of a git
revision (checked out in a temporary worktree) in the same run, and prints the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dex.testing import ServerProcess, WorkerProcess, wait_until_async

from . import agents
from .turns import metrics, render_table

AGENT = agents.bench.name
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Count:
    code: str
    concurrency: int
    turns: int
    """How many of ``what`` were measured."""
    server: int
    worker: int | None
    what: str = "turn"

    def per_turn(self, value: int | None) -> float | None:
        return None if value is None else value / self.turns


class Callgrind:
    """``callgrind_control`` on a process started under callgrind with instrumentation off."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.out = directory / f"{name}.callgrind"
        self.pid = 0

    @property
    def wrap(self) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=yes",
            f"--callgrind-out-file={self.out}",
        ]

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self) -> int:
        """Instructions counted since ``start``, all threads."""
        before = set(self.directory.glob(self.out.name + "*"))
        self._control("--instr=off")
        self._control("--dump")
        for _ in range(600):
            new = set(self.directory.glob(self.out.name + "*")) - before
            for path in new:
                text = path.read_text(errors="replace")
                for line in text.splitlines():
                    if line.startswith("totals:"):  # callgrind's summary: line reads 0 here
                        return int(line.split()[1])
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump")


async def _turns(
    http: aiohttp.ClientSession,
    address: str,
    concurrency: int,
    turns: int,
    tenant: str | None = None,
) -> None:
    """``turns`` turns over ``concurrency`` fresh sessions (of ``tenant``'s), each lane one
    turn at a time. Plain HTTP with long timeouts: under callgrind a turn may take seconds."""
    each, extra = divmod(turns, concurrency)
    timeout = aiohttp.ClientTimeout(total=900)

    async def call(method: str, path: str, body: object = None) -> dict[str, Any]:
        async with http.request(method, address + path, json=body, timeout=timeout) as r:
            result: dict[str, Any] = await r.json()
            if r.status >= 400:
                raise RuntimeError(f"{method} {path}: {r.status} {result}")
            return result

    async def lane(n: int) -> None:
        session = (await call("POST", "/v1/sessions", {"agent": AGENT, "tenant": tenant}))["id"]
        for _ in range(n):
            turn = await call(
                "POST", f"/v1/sessions/{session}/messages", {"text": "go", "wait_seconds": 600}
            )
            while turn["status"] == "running":
                turn = await call(
                    "GET", f"/v1/sessions/{session}/turns/{turn['turn']}?wait_seconds=600"
                )
            if turn["status"] != "completed":
                raise RuntimeError(f"a turn ended {turn['status']}: {turn}")

    await asyncio.gather(*(lane(each + (i < extra)) for i in range(concurrency)))


async def _creations(address: str, concurrency: int, n: int) -> None:
    """``n`` session creations (``POST /v1/sessions``) over ``concurrency`` lanes, on fresh
    connections (the server closes ones left idle while callgrind dumped)."""
    each, extra = divmod(n, concurrency)
    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def lane(k: int) -> None:
            for _ in range(k):
                async with http.post(
                    address + "/v1/sessions", json={"agent": AGENT}, timeout=timeout
                ) as r:
                    if r.status != 201:
                        raise RuntimeError(f"POST /v1/sessions: {r.status} {await r.text()}")

        await asyncio.gather(*(lane(each + (i < extra)) for i in range(concurrency)))


async def measure(
    code: str,
    src: Path | None,
    args: argparse.Namespace,
    tmp: Path,
    *,
    agents_file: Path = ROOT / "bench" / "agents.py",
    server_env: Mapping[str, str] | None = None,
    tenant: tuple[str, dict[str, Any] | None] | None = None,
) -> list[Count]:
    """Count the server's instructions (and with ``args.worker`` the Worker's) per turn of
    ``agents_file``'s agent ``bench``; ``server_env``: more of the server's environment;
    ``tenant``: the sessions' tenant and the budget set for it first (None: none)."""
    env = {"PYTHONPATH": str(src)} if src is not None else {}
    work = tmp / code
    work.mkdir()
    server_cg = Callgrind(work, "server")
    worker_cg = Callgrind(work, "worker") if args.worker else None
    server = ServerProcess(
        work / "data",
        env={**env, **(server_env or {})},
        wrap=server_cg.wrap,
        heartbeat_timeout=600,
    )
    worker = WorkerProcess(
        str(agents_file),
        server.address,
        work / "worker.log",
        env=env,
        capacity=128,
        wrap=worker_cg.wrap if worker_cg else (),
    )
    counts = []
    try:
        await asyncio.to_thread(server.start, timeout=600)
        server_cg.pid = server.pid
        worker.start()
        if worker_cg is not None:
            worker_cg.pid = worker.pid
        connector = aiohttp.TCPConnector(limit=max(args.concurrency) + 8)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def worker_ready() -> bool:
                if not worker.alive:
                    raise RuntimeError(f"the Worker exited:\n{worker.output()[-3000:]}")
                return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

            await wait_until_async(worker_ready, 600, 0.2, "the Worker connected")
            if tenant is not None and tenant[1] is not None:
                url = f"{server.address}/admin/tenants/{tenant[0]}/budget"
                async with http.put(url, json=tenant[1]) as r:
                    if r.status != 200:
                        raise RuntimeError(f"PUT {url}: {r.status} {await r.text()}")
            name = tenant[0] if tenant is not None else None
            for concurrency in args.concurrency:
                if args.turns:
                    turns = max(args.turns, concurrency * 4)
                    print(f"  {code}: {concurrency} sessions, {turns} turns ...", flush=True)
                    await _turns(http, server.address, concurrency, concurrency * 2, name)  # warm
                    await asyncio.to_thread(server_cg.start)
                    if worker_cg is not None:
                        await asyncio.to_thread(worker_cg.start)
                    await _turns(http, server.address, concurrency, turns, name)
                    server_n = await asyncio.to_thread(server_cg.stop)
                    worker_n = await asyncio.to_thread(worker_cg.stop) if worker_cg else None
                    counts.append(Count(code, concurrency, turns, server_n, worker_n))
                if args.creations:
                    n = max(args.creations, concurrency * 4)
                    print(f"  {code}: {concurrency} clients, {n} session creations ...")
                    await _creations(server.address, concurrency, concurrency * 4)
                    await asyncio.to_thread(server_cg.start)
                    await _creations(server.address, concurrency, n)
                    server_n = await asyncio.to_thread(server_cg.stop)
                    counts.append(Count(code, concurrency, n, server_n, None, "creation"))
    finally:
        for proc in (worker, server):
            if proc.alive:
                proc.kill()
    return counts


@contextlib.contextmanager
def baseline_tree(rev: str | None, tmp: Path) -> Iterator[Path | None]:
    """A temporary worktree of ``rev`` under ``tmp``, removed on the way out; None when
    no baseline is asked for."""
    if not rev:
        yield None
        return
    path = tmp / "baseline-tree"
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(path), rev], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run([*git, "remove", "--force", str(path)], check=False, capture_output=True)


def report(counts: list[Count], args: argparse.Namespace) -> str:
    headers = ["code", "sessions", "per", "measured", "server Minstr"]
    if args.worker:
        headers.append("Worker Minstr")
    rows = []
    by_key = {(c.code, c.concurrency, c.what): c for c in counts}
    for c in counts:
        row = [c.code, str(c.concurrency), c.what, str(c.turns), f"{c.server / c.turns / 1e6:.3f}"]
        if args.worker:
            w = c.per_turn(c.worker)
            row.append("" if w is None else f"{w / 1e6:.3f}")
        rows.append(row)
    if args.baseline:
        for concurrency, what in sorted({(c.concurrency, c.what) for c in counts}):
            new = by_key[("current", concurrency, what)]
            old = by_key[("baseline", concurrency, what)]
            ratio = new.server / new.turns / (old.server / old.turns)
            row = ["current/baseline", str(concurrency), what, "", f"{ratio:.2f}x"]
            if args.worker and new.worker and old.worker:
                row.append(f"{new.worker / new.turns / (old.worker / old.turns):.2f}x")
            elif args.worker:
                row.append("")
            rows.append(row)
    lines = [
        "Dex instructions per turn (callgrind; model -> read tool -> model, SQLite durable"
        " defaults)",
        "",
        render_table(rows, headers),
        "",
        "  Minstr: millions of instructions the process ran (every thread) over the measured"
        " turns (or session creations), per turn (or creation).",
        "  At high concurrency under callgrind more work shares each commit and frame than at"
        " full speed: a lower bound.",
        "  The server's SQLite writer runs in a process of its own (since 2026-12-06), not"
        " under callgrind: its statements and commits are not counted.",
    ]
    return "\n".join(lines)


async def bench(args: argparse.Namespace, tmp: Path, baseline: Path | None) -> str:
    counts: list[Count] = []
    if baseline is not None:
        counts += await measure("baseline", baseline / "src", args, tmp)
    counts += await measure("current", None, args, tmp)
    return report(counts, args)


def run(args: argparse.Namespace, tmp: Path) -> str:
    with baseline_tree(args.baseline, tmp) as tree:
        return asyncio.run(bench(args, tmp, tree))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--turns", type=int, default=200, help="measured turns per phase (0: no turns)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--baseline", metavar="REV", help="also measure this git revision")
    parser.add_argument("--worker", action="store_true", help="count the Worker's too")
    parser.add_argument(
        "--creations",
        type=int,
        default=0,
        metavar="N",
        help="also count the server's instructions per session creation over N creations",
    )
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep the callgrind dumps in DIR")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.instructions needs valgrind (apt-get install valgrind)")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        print(run(args, args.keep.resolve()))
        return 0
    with tempfile.TemporaryDirectory(prefix="dex-instr-") as tmp:
        print(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

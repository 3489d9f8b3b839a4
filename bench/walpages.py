"""Which tables and indexes the pages of a group commit belong to, under bench.turns' load.

    .venv/bin/python -m bench.walpages [--seconds 4] [--concurrency 64]

SQLite in WAL mode writes every page a transaction changed, whole (4 KiB), to the WAL
and fsyncs it at COMMIT. So the pages per commit, not the bytes of JSON, are what the
disk is asked to write. This runs the turns of ``bench.turns`` (a Dex Server with its
durable defaults, a Worker, N sessions at once) and, every ``--every`` seconds, stops the
server for a moment (SIGSTOP), reads its WAL and lets it go on (SIGCONT). Each frame of a
WAL names the page it holds, and the last frame of a transaction says so; the pages are
then given to the B-tree that holds them now (SQLite's ``dbstat`` on a copy of the
database). Checkpoints restart the WAL, so a snapshot sees only the commits since the
last one: the figures are averages over the commits seen, which are most of them.

Pages do not move with the machine's load the way times do, so a change to the schema or
to what a write touches can be judged by one run of this on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

import dex
from bench import agents
from bench.turns import Phase, metrics, run_phase, tailed_and_stopped
from dex.testing import ServerProcess, WorkerProcess, wait_until_async

WAL_HEADER = 32
FRAME_HEADER = 24

Commit = tuple[bytes, int, tuple[int, ...]]
"""A transaction in a WAL: its generation's salts, its first frame's index, its pages."""


def commits(wal: bytes) -> list[Commit]:
    """The committed transactions of a WAL file's current generation, in order. Frames
    after the last commit frame (a transaction being written) and frames left from an
    earlier generation (other salts) are not counted."""
    if len(wal) < WAL_HEADER:
        return []
    page_size = struct.unpack(">I", wal[8:12])[0]
    salts = wal[16:24]
    found: list[Commit] = []
    pages: list[int] = []
    first = 0
    index = 0
    offset = WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(wal):
        page, size_after = struct.unpack(">II", wal[offset : offset + 8])
        if wal[offset + 8 : offset + 16] != salts:
            break
        pages.append(page)
        if size_after:  # the commit frame: the database's size in pages after it
            found.append((salts, first, tuple(pages)))
            pages = []
            first = index + 1
        index += 1
        offset += FRAME_HEADER + page_size
    return found


def owners(database: Path) -> dict[int, str]:
    """Page number -> the table or index that holds it, in a copy of a database (and its
    WAL) that nothing else has open."""
    conn = sqlite3.connect(database)
    try:
        rows = conn.execute("SELECT name, pageno FROM dbstat").fetchall()
    finally:
        conn.close()
    return {int(page): str(name) for name, page in rows}


class Snapshots:
    """WAL snapshots of a running server, each taken while it is stopped."""

    def __init__(self, pid: int, database: Path) -> None:
        self.pid = pid
        self.database = database
        self.seen: dict[tuple[bytes, int], tuple[int, ...]] = {}

    def take(self, copy_to: Path | None = None) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        try:
            wal = Path(f"{self.database}-wal").read_bytes()
            if copy_to is not None:
                shutil.copyfile(self.database, copy_to)
                Path(f"{copy_to}-wal").write_bytes(wal)
        finally:
            os.kill(self.pid, signal.SIGCONT)
        for salts, first, pages in commits(wal):
            self.seen[(salts, first)] = pages

    async def every(self, seconds: float, until: float) -> None:
        while time.perf_counter() + seconds < until:
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.take)


def report(
    seen: list[tuple[int, ...]],
    owner: dict[int, str],
    turns: int,
    operations: float,
    commits_run: float,
    json_bytes: float,
    page_size: int,
) -> str:
    n = len(seen)
    pages = sum(len(p) for p in seen)
    by_tree: Counter[str] = Counter()
    for commit in seen:
        for page in commit:
            by_tree[owner.get(page, "(freed since)")] += 1
    per_commit = pages / n
    ops_per_commit = operations / max(commits_run, 1)
    per_turn = per_commit * commits_run / max(turns, 1)
    out = [
        f"{n} commits seen (the warm-up's too); the measured seconds ran {commits_run:.0f} "
        f"commits, {ops_per_commit:.1f} store ops each, for {turns} turns",
        f"  pages a commit: {per_commit:.1f}; a store op: {per_commit / ops_per_commit:.2f}; "
        f"a turn: {per_turn:.1f}",
        f"  WAL bytes a turn: {per_turn * (page_size + FRAME_HEADER):,.0f}, for "
        f"{json_bytes / max(turns, 1):,.0f} bytes of JSON committed a turn "
        f"({per_turn * (page_size + FRAME_HEADER) / max(json_bytes / max(turns, 1), 1):.1f}x)",
        "",
        f"{'table or index':32} {'pages a commit':>15} {'share':>7}",
    ]
    for name, count in by_tree.most_common():
        out.append(f"{name:32} {count / n:15.2f} {count / pages:7.1%}")
    out += [
        "",
        "  sqlite_autoindex_<table>_1 is the index SQLite keeps for a table's TEXT primary key;",
        "  a row of such a table is written twice, in the table (rowid order) and in it.",
    ]
    return "\n".join(out)


async def bench(
    args: argparse.Namespace, tmp: Path, agents_file: str
) -> tuple[list[tuple[int, ...]], Phase, float]:
    """The pages of the commits seen, the measured phase, and the bytes of JSON it
    committed. Leaves a copy of the database and its WAL at ``tmp/copy.sqlite3``."""
    server = ServerProcess(tmp / "data")
    worker = WorkerProcess(agents_file, server.address, tmp / "worker.log", capacity=128)
    with tailed_and_stopped(server, worker):
        await asyncio.to_thread(server.start)
        worker.start()
        database = server.data_dir / "dex.sqlite3"
        async with (
            aiohttp.ClientSession() as http,
            dex.Client(server.address, connections=args.concurrency + 16) as client,
        ):

            async def worker_ready() -> bool:
                return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

            await wait_until_async(worker_ready, 20, 0.05, "the Worker connected")
            snapshots = Snapshots(server.pid, database)
            before = await metrics(http, server.address)
            print(
                f"{args.concurrency} sessions, {args.seconds:g} s, a WAL snapshot every "
                f"{args.every:g} s ...",
                flush=True,
            )
            # snapshots through run_phase's warm-up (1 s) and its measured seconds
            until = time.perf_counter() + 1 + args.seconds
            watching = asyncio.create_task(snapshots.every(args.every, until))
            phase = await run_phase(
                client, http, server, worker, args.concurrency, args.seconds, 1, 20, None
            )
            await watching
            after = await metrics(http, server.address)
            await asyncio.to_thread(snapshots.take, tmp / "copy.sqlite3")

    def delta(name: str) -> float:
        return after[name] - before[name]

    # bytes of JSON a store op over the whole run (warm-up included), ops a turn measured
    json_per_op = delta("dex_store_written_bytes_total") / delta("dex_store_operations_total")
    return list(snapshots.seen.values()), phase, json_per_op * phase.operations


def page_size(database: Path) -> int:
    conn = sqlite3.connect(database)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.walpages", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds")
    parser.add_argument("--concurrency", type=int, default=64, help="sessions at once")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between snapshots")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.concurrency < 1 or args.every <= 0:
        parser.error("--seconds and --every > 0, --concurrency >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    agents_file = str(Path(agents.__file__).resolve())  # the Worker loads it by path
    with tempfile.TemporaryDirectory(prefix="dex-walpages-") as tmp:
        seen, phase, json_bytes = asyncio.run(bench(args, Path(tmp), agents_file))
        copy = Path(tmp) / "copy.sqlite3"
        text = report(
            seen,
            owners(copy),
            phase.turns,
            phase.operations,
            phase.commits,
            json_bytes,
            page_size(copy),
        )
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

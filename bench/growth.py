"""Costs that must not grow: a turn deep in a long conversation, and a turn of many Steps.

    .venv/bin/python -m bench.growth [--turns 60] [--history 10 1000] [--steps 3 51]

A Dex Server (durable defaults) and a Worker run in their own processes; this process
is the client. The agent (``bench/growth_agents.py``) runs turns of N ``read`` calls one
after another: 2N + 1 Steps. Two comparisons, each against its own small case measured
in the same run:

- history: turns of 3 Steps in sessions whose history holds about 10 items (fresh
  sessions) against a session whose history holds about 1,000 items. The target: a turn
  costs within 1.3x (server and Worker CPU per turn, bytes sent to Workers per hand-out,
  bytes committed per turn).
- Steps per turn: turns of 3 Steps against turns of 51 Steps, each in a fresh session.
  The target: no more bytes committed per Step, and no more server CPU per Step, than a
  3-Step turn (within 1.3x).

Bytes are read from the server's /metrics (``dex_worker_sent_bytes_total``,
``dex_store_written_bytes_total``), CPU from /proc. Everything lives in a temporary
directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until_async

from . import growth_agents
from .turns import cpu_seconds, metrics, render_table, tailed_and_stopped

AGENT = growth_agents.growth.name
TARGET_RATIO = 1.3


@dataclass
class Cost:
    label: str
    turns: int
    steps: int
    history: float
    """Mean history items before each measured turn."""
    server_cpu: float
    worker_cpu: float
    sent: float
    written: float

    def per_turn(self, value: float) -> float:
        return value / self.turns

    def per_step(self, value: float) -> float:
        return value / self.steps


class Run:
    def __init__(
        self,
        client: dex.Client,
        http: aiohttp.ClientSession,
        server: ServerProcess,
        worker: WorkerProcess,
    ) -> None:
        self.client, self.http, self.server, self.worker = client, http, server, worker

    async def turn(self, session: str, calls: int) -> int:
        """One turn of ``calls`` tool calls; its history length after."""
        turn = await self.client.send_message(session, str(calls), wait=True, timeout=60)
        if turn["status"] != "completed":
            raise RuntimeError(f"a turn ended {turn['status']}: {turn}")
        snapshot = await self.client.get_agent_snapshot(session)
        return len(snapshot["history"])

    async def measure(self, label: str, plan: list[tuple[str, int, int]]) -> Cost:
        """Run ``plan``'s turns (session, calls, history before) and measure only them."""
        before = await metrics(self.http, self.server.address)
        cpu = (cpu_seconds(self.server.pid), cpu_seconds(self.worker.pid))
        for session, calls, _ in plan:
            turn = await self.client.send_message(session, str(calls), wait=True, timeout=60)
            if turn["status"] != "completed":
                raise RuntimeError(f"a turn ended {turn['status']}: {turn}")
        after = await metrics(self.http, self.server.address)
        return Cost(
            label=label,
            turns=len(plan),
            steps=sum(2 * calls + 1 for _, calls, _ in plan),
            history=sum(h for _, _, h in plan) / len(plan),
            server_cpu=cpu_seconds(self.server.pid) - cpu[0],
            worker_cpu=cpu_seconds(self.worker.pid) - cpu[1],
            sent=after["dex_worker_sent_bytes_total"] - before["dex_worker_sent_bytes_total"],
            written=after["dex_store_written_bytes_total"]
            - before["dex_store_written_bytes_total"],
        )

    async def sessions(self, count: int) -> list[str]:
        return [(await self.client.create_session(AGENT))["id"] for _ in range(count)]


ITEMS_PER_TURN = 4  # user, assistant (a tool call), tool result, assistant


async def history_costs(run: Run, short: int, long: int, turns: int) -> tuple[Cost, Cost]:
    # Short: fresh sessions, each brought to about ``short`` items before its measured turn.
    plan: list[tuple[str, int, int]] = []
    fill = max(0, short // ITEMS_PER_TURN)
    for session in await run.sessions(turns):
        length = 0
        for _ in range(fill):
            length = await run.turn(session, 1)
        plan.append((session, 1, length))
    small = await run.measure(f"history ~{short}", plan)
    # Long: one session filled to ``long`` items, then ``turns`` turns in it.
    [session] = await run.sessions(1)
    length = 0
    while length < long:
        length = await run.turn(session, 1)
    plan = [(session, 1, length + i * ITEMS_PER_TURN) for i in range(turns)]
    return small, await run.measure(f"history ~{long}", plan)


async def step_costs(run: Run, small: int, large: int, turns: int) -> tuple[Cost, Cost]:
    out = []
    for steps in (small, large):
        calls = (steps - 1) // 2
        count = max(2, turns * small // steps)  # about as many Steps in each case
        plan = [(s, calls, 0) for s in await run.sessions(count)]
        out.append(await run.measure(f"{2 * calls + 1} Steps/turn", plan))
    return out[0], out[1]


def ratio(base: float, value: float) -> str:
    mark = "ok" if value <= base * TARGET_RATIO else "MISSED"
    return f"{value / base:.2f}x {mark}" if base else "n/a"


def report(history: tuple[Cost, Cost], steps: tuple[Cost, Cost]) -> str:
    out = ["", "Dex growth benchmark (server, Worker and client in 3 processes, SQLite)", ""]
    a, b = history
    rows = []
    for c in history:
        hand_outs = c.steps
        rows.append(
            [
                c.label,
                str(c.turns),
                f"{c.history:.0f}",
                f"{c.per_turn(c.server_cpu) * 1000:.2f}",
                f"{c.per_turn(c.worker_cpu) * 1000:.2f}",
                f"{c.sent / hand_outs:.0f}",
                f"{c.per_turn(c.written):.0f}",
            ]
        )
    rows.append(
        [
            "long / short",
            "",
            "",
            ratio(a.per_turn(a.server_cpu), b.per_turn(b.server_cpu)),
            ratio(a.per_turn(a.worker_cpu), b.per_turn(b.worker_cpu)),
            ratio(a.sent / a.steps, b.sent / b.steps),
            ratio(a.per_turn(a.written), b.per_turn(b.written)),
        ]
    )
    header = ["turns of 3 Steps", "turns", "history", "server CPU ms/turn"]
    header += ["Worker CPU ms/turn", "bytes sent/hand-out", "bytes committed/turn"]
    out += [render_table(rows, header), ""]
    a, b = steps
    rows = [
        [
            c.label,
            str(c.turns),
            str(c.steps),
            f"{c.per_step(c.server_cpu) * 1000:.3f}",
            f"{c.sent / c.steps:.0f}",
            f"{c.per_step(c.written):.0f}",
        ]
        for c in steps
    ]
    rows.append(
        [
            "large / small",
            "",
            "",
            ratio(a.per_step(a.server_cpu), b.per_step(b.server_cpu)),
            ratio(a.sent / a.steps, b.sent / b.steps),
            ratio(a.per_step(a.written), b.per_step(b.written)),
        ]
    )
    header = ["Steps per turn", "turns", "Steps", "server CPU ms/Step"]
    header += ["bytes sent/hand-out", "bytes committed/Step"]
    out += [render_table(rows, header), ""]
    out.append(
        f"  ok: within {TARGET_RATIO}x of the small case. CPU is read in clock ticks "
        "(10 ms): use --turns 60 or more for CPU figures worth comparing."
    )
    return "\n".join(out)


async def bench(args: argparse.Namespace, tmp: Path, agents_file: str) -> str:
    server = ServerProcess(tmp / "data")
    worker = WorkerProcess(agents_file, server.address, tmp / "worker.log", capacity=16)
    with tailed_and_stopped(server, worker):
        await asyncio.to_thread(server.start)
        worker.start()
        async with aiohttp.ClientSession() as http, dex.Client(server.address) as client:

            async def worker_ready() -> bool:
                if not worker.alive:
                    raise RuntimeError(f"the Worker exited:\n{worker.output()[-3000:]}")
                return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

            await wait_until_async(worker_ready, 20, 0.05, "the Worker connected")
            run = Run(client, http, server, worker)
            print("warming up ...", flush=True)
            await run.measure("warm-up", [(s, 1, 0) for s in await run.sessions(10)])
            short, long = args.history
            print(f"history ~{short} against ~{long} items ...", flush=True)
            history = await history_costs(run, short, long, args.turns)
            small, large = args.steps
            print(f"{small} against {large} Steps per turn ...", flush=True)
            steps = await step_costs(run, small, large, args.turns)
    return report(history, steps)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.growth", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--turns", type=int, default=60, help="measured turns per case")
    parser.add_argument("--history", type=int, nargs=2, default=[10, 1000], metavar=("S", "L"))
    parser.add_argument("--steps", type=int, nargs=2, default=[3, 51], metavar=("S", "L"))
    args = parser.parse_args(argv)
    if args.turns < 1 or min(args.history) < 0 or min(args.steps) < 3:
        parser.error("--turns >= 1, --history >= 0, --steps >= 3 (odd: 2N + 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dex-growth-") as tmp:
        agents_file = str(Path(growth_agents.__file__).resolve())  # the Worker loads it by path
        print(asyncio.run(bench(args, Path(tmp), agents_file)))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

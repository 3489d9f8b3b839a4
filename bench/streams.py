"""Live streams: how long a model's text takes from the Worker to a client, and what idle
subscribers cost the server, on each stream backend.

    .venv/bin/python -m bench.streams [--short] [--backends memory redis]

For each backend (the in-memory default; Redis Streams at ``$DEX_BENCH_REDIS``, default
``redis://127.0.0.1:6379/0``) a Dex Server and a Worker run in their own processes and
the subscribers here, each reading ``dex.Client.stream_events``:

- **Delta latency** at 1 and 100 subscribers of one session: the model
  (``bench/streams_agents.py``) streams deltas 5 ms apart, each stamped with the wall
  clock at its emit in the Worker; a subscriber subtracts the stamp from the time it
  reads it. All subscribers share this one process, as they would share a proxy: at 100,
  their own parsing is part of the figure.
- **Idle subscribers**: 1,000 subscribers on 100 idle sessions; the server's resident
  memory before and after, per subscriber.

The baseline, from the same run: the round trip of a bare request (``GET /healthz``) to
the same server, so the latency reads as a multiple of it. ``--short`` is the form CI
runs: fewer deltas and subscribers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until_async

from . import streams_agents
from .turns import (
    cpu_seconds,
    memory_kib,
    metrics,
    ms,
    percentile,
    render_table,
    tailed_and_stopped,
)

AGENT = streams_agents.ticker.name
INTERVAL_MS = 5
REDIS = os.environ.get("DEX_BENCH_REDIS", "redis://127.0.0.1:6379/0")


@dataclass
class Latency:
    backend: str
    subscribers: int
    seconds: list[float]
    """One per delta per subscriber."""
    bare: list[float]
    server_cpu: float
    """Server CPU seconds while the turn streamed."""


@dataclass
class Idle:
    backend: str
    subscribers: int
    rss_before_kib: int
    rss_after_kib: int

    @property
    def per_subscriber_kib(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / self.subscribers


async def bare_round_trips(http: aiohttp.ClientSession, address: str, n: int) -> list[float]:
    seconds = []
    for _ in range(n):
        start = time.perf_counter()
        async with http.get(address + "/healthz") as response:
            await response.read()
        seconds.append(time.perf_counter() - start)
    return seconds


async def subscribed(http: aiohttp.ClientSession, address: str, n: int) -> None:
    async def enough() -> bool:
        return (await metrics(http, address)).get("dex_stream_subscribers", 0) >= n

    await wait_until_async(enough, 60, 0.05, f"{n} subscribers counted by the server")


async def follow(client: dex.Client, sid: str, latencies: list[float]) -> int:
    """Read the session's stream until its turn completes; the latency of each stamp."""
    deltas = 0
    async for event in client.stream_events(sid, reconnect=False):
        if event["type"] == "model.delta":
            now = time.time_ns()
            for stamp in event["data"]["text"].split(";"):
                if stamp:
                    latencies.append((now - int(stamp)) / 1e9)
                    deltas += 1
        elif event["type"] == "turn.completed":
            return deltas
    raise RuntimeError("the stream ended before the turn completed")


async def latency(
    client: dex.Client,
    http: aiohttp.ClientSession,
    server: ServerProcess,
    backend: str,
    subscribers: int,
    deltas: int,
) -> Latency:
    sid = (await client.create_session(AGENT))["id"]
    seconds: list[float] = []
    readers = [asyncio.create_task(follow(client, sid, seconds)) for _ in range(subscribers)]
    await subscribed(http, server.address, subscribers)
    bare = await bare_round_trips(http, server.address, 200)
    cpu = cpu_seconds(server.pid)
    await client.send_message(sid, f"{deltas} {INTERVAL_MS}")
    counts = await asyncio.wait_for(asyncio.gather(*readers), 120)
    cpu = cpu_seconds(server.pid) - cpu
    if counts != [deltas] * subscribers:
        raise RuntimeError(f"subscribers read {sorted(set(counts))} deltas, not {deltas}")
    await wait_until_async(
        lambda: _none_subscribed(http, server.address), 30, 0.05, "subscribers gone"
    )
    return Latency(backend, subscribers, seconds, bare, cpu)


async def _none_subscribed(http: aiohttp.ClientSession, address: str) -> bool:
    return (await metrics(http, address)).get("dex_stream_subscribers", 1) == 0


async def idle(
    client: dex.Client,
    http: aiohttp.ClientSession,
    server: ServerProcess,
    backend: str,
    subscribers: int,
) -> Idle:
    sessions = [(await client.create_session(AGENT))["id"] for _ in range(subscribers // 10)]
    before = memory_kib(server.pid, "VmRSS")

    async def hold(sid: str) -> None:
        async for _ in client.stream_events(sid, reconnect=False):
            pass

    holders = [asyncio.create_task(hold(sessions[i % len(sessions)])) for i in range(subscribers)]
    try:
        await subscribed(http, server.address, subscribers)
        after = memory_kib(server.pid, "VmRSS")
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    return Idle(backend, subscribers, before, after)


async def run_backend(
    tmp: Path, backend: str, url: str, args: argparse.Namespace
) -> tuple[list[Latency], Idle]:
    agents_file = streams_agents.__file__  # the Worker loads it by path
    server = ServerProcess(tmp / f"data-{backend}", env={"DEX_STREAMS": url})
    worker = WorkerProcess(agents_file, server.address, tmp / f"worker-{backend}.log")
    connections = max(args.idle, *args.subscribers) + 16
    with tailed_and_stopped(server, worker):
        await asyncio.to_thread(server.start)
        worker.start()
        async with (
            aiohttp.ClientSession() as http,
            dex.Client(server.address, connections=connections, timeout=60) as client,
        ):

            async def worker_ready() -> bool:
                if not worker.alive:
                    raise RuntimeError(f"the Worker exited:\n{worker.output()[-3000:]}")
                return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

            await wait_until_async(worker_ready, 20, 0.05, "the Worker connected")
            await latency(client, http, server, backend, 1, 20)  # warm-up
            phases = []
            for n in args.subscribers:
                print(f"{backend}: {n} subscribers, {args.deltas} deltas ...", flush=True)
                phases.append(await latency(client, http, server, backend, n, args.deltas))
            print(f"{backend}: {args.idle} idle subscribers ...", flush=True)
            held = await idle(client, http, server, backend, args.idle)
        return phases, held


def report(latencies: list[Latency], idles: list[Idle]) -> str:
    rows = []
    for p in latencies:
        bare = percentile(p.bare, 50)
        delivered = len(p.seconds)
        rows.append(
            [
                p.backend,
                str(p.subscribers),
                str(delivered),
                ms(percentile(p.seconds, 50)),
                ms(percentile(p.seconds, 99)),
                ms(bare),
                f"{percentile(p.seconds, 50) / bare:.1f}x",
                f"{p.server_cpu / delivered * 1e6:.0f} µs",
            ]
        )
    header = [
        "backend",
        "subscribers",
        "deltas read",
        "p50 emit→client ms",
        "p99 ms",
        "bare request p50 ms",
        "p50 / bare",
        "server CPU per delta read",
    ]
    text = "Delta latency, from the Worker's emit to the client:\n\n" + render_table(rows, header)
    idle_rows = [
        [
            i.backend,
            str(i.subscribers),
            f"{i.rss_before_kib / 1024:.1f} MiB",
            f"{i.rss_after_kib / 1024:.1f} MiB",
            f"{i.per_subscriber_kib:.1f} KiB",
        ]
        for i in idles
    ]
    idle_header = ["backend", "idle subscribers", "server RSS before", "after", "per subscriber"]
    text += "\n\nIdle subscribers:\n\n" + render_table(idle_rows, idle_header)
    if len(idles) == 2:
        memory, redis = idles
        by_n = {(p.backend, p.subscribers): p for p in latencies}
        ratios = []
        for n in sorted({p.subscribers for p in latencies}):
            if ("memory", n) in by_n and ("redis", n) in by_n:
                ratio = percentile(by_n["redis", n].seconds, 50) / percentile(
                    by_n["memory", n].seconds, 50
                )
                ratios.append(f"at {n} subscribers, Redis's p50 is {ratio:.2f}x memory's")
        ratios.append(
            f"an idle subscriber costs {redis.per_subscriber_kib / memory.per_subscriber_kib:.2f}x"
        )
        text += "\n\nRedis against memory, same run: " + "; ".join(ratios) + "."
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streams", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--backends", nargs="+", choices=["memory", "redis"], default=["memory", "redis"]
    )
    parser.add_argument("--short", action="store_true", help="the short form CI runs")
    args = parser.parse_args(argv)
    args.deltas = 40 if args.short else 400
    args.subscribers = [1, 10] if args.short else [1, 100]
    args.idle = 100 if args.short else 1000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    latencies: list[Latency] = []
    idles: list[Idle] = []
    with tempfile.TemporaryDirectory(prefix="dex-bench-streams-") as tmp:
        for backend in args.backends:
            url = REDIS if backend == "redis" else "memory"
            phases, held = asyncio.run(run_backend(Path(tmp), backend, url, args))
            latencies += phases
            idles.append(held)
    print(report(latencies, idles))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

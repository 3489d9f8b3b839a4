"""Model limits in a cluster: the model calls a group's rate limit admits over two nodes
on PostgreSQL, each node admitting its share of the limit (the part of the partitions it
serves: docs/flow-control.md), against the limit and against one node alone in the same
run. Two spreads of the load over two nodes: sessions spread over the partitions as
random ids spread them, and every session in one node's partitions (the share rule's
worst case: the other node's share goes unused).

    .venv/bin/python -m bench.flow_cluster [--rpm 1200] [--seconds 20] [--sessions 64]
    .venv/bin/python -m bench.flow_cluster --short      # CI: under a minute

The agent is ``bench/agents.py``'s (two model calls a turn, group ``scripted/scripted``).
Model calls are counted by each node's ``dex_attempts_total`` of succeeded RunModel
attempts over the measured seconds, after a warm-up. The admitted rate can exceed the
limit by the burst a gate allows at once (``limits.BURST``: one second's worth) over a
measured window; a figure above that is a failure (exit 1). The error of the share rule
is the figure of the one-sided spread.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from dex.server.dispatch.limits import BURST
from dex.server.store.partitions import partition_of

from .cluster import Nodes, Owners, Router, database
from .turns import Lane, Phase, metrics

GROUP = "scripted/scripted"
"""The model group of ``bench/agents.py``'s model."""


class OneSided(Router):
    """``Router`` whose new sessions all lie in the partitions node ``address`` owns."""

    def __init__(self, owners: Owners, address: str) -> None:
        super().__init__(owners)
        self.address = address
        self._n = itertools.count()

    async def create_session(self, agent: str, session_id: str | None = None) -> dict[str, Any]:
        while True:
            sid = f"skew_{os.getpid()}_{next(self._n)}"
            owner = self.owners.of.get(partition_of(sid, self.owners.count))
            if owner is not None and owner.address == self.address:
                return await super().create_session(agent, sid)


@dataclass
class Figure:
    name: str
    calls: float
    seconds: float
    failed: int

    @property
    def rpm(self) -> float:
        return self.calls / self.seconds * 60


async def model_calls(http: aiohttp.ClientSession, addresses: list[str]) -> float:
    """Succeeded RunModel attempts, by the nodes' ``dex_attempts_total``."""
    total = 0.0
    for address in addresses:
        for name, value in (await metrics(http, address)).items():
            ok = 'step_type="RunModel"' in name and 'outcome="succeeded"' in name
            if name.startswith("dex_attempts_total{") and ok:
                total += value
    return total


async def phase(
    name: str,
    router: Router,
    http: aiohttp.ClientSession,
    addresses: list[str],
    args: argparse.Namespace,
) -> Figure:
    lanes = [Lane(router, 20) for _ in range(args.sessions)]
    print(f"{name} ...", flush=True)
    await asyncio.gather(*(lane.run(time.perf_counter() + args.warmup, None) for lane in lanes))
    measured = Phase(args.sessions)
    before = await model_calls(http, addresses)
    start = time.perf_counter()
    await asyncio.gather(*(lane.run(start + args.seconds, measured) for lane in lanes))
    seconds = time.perf_counter() - start
    calls = await model_calls(http, addresses) - before
    return Figure(name, calls, seconds, measured.failed)


async def bench(args: argparse.Namespace, tmp: Path, url: str) -> tuple[list[str], list[str]]:
    os.environ["DEX_MODEL_LIMITS"] = orjson.dumps({GROUP: {"rpm": args.rpm}}).decode()
    nodes = Nodes(tmp, url)
    owners = Owners(url)
    figures: list[Figure] = []
    try:
        async with aiohttp.ClientSession() as http, Router(owners) as router:
            await nodes.start(0)
            await owners.open()
            await nodes.wait_balanced(owners, http)
            one = [nodes.servers[0].address]
            figures.append(await phase("one node", router, http, one, args))
            await nodes.start(1)
            await nodes.wait_balanced(owners, http)
            two = [nodes.servers[i].address for i in nodes.up]
            figures.append(await phase("two nodes, sessions spread", router, http, two, args))
            async with OneSided(owners, two[0]) as skewed:
                figures.append(await phase("two nodes, sessions on one", skewed, http, two, args))
    except BaseException:
        print(nodes.tails(), file=sys.stderr)
        raise
    finally:
        await owners.close()
        nodes.stop()
    most = args.rpm * (1 + BURST / args.seconds) + 60 / args.seconds  # and the burst
    out = [
        f"model group {GROUP}: rpm limit {args.rpm:g}, {args.sessions} sessions, "
        f"{args.seconds:g} s measured each",
        f"{'phase':<30} {'model calls/min':>16} {'of the limit':>13} {'turns failed':>13}",
    ]
    problems = []
    for f in figures:
        out.append(f"{f.name:<30} {f.rpm:>16.0f} {f.rpm / args.rpm:>13.2f} {f.failed:>13}")
        if f.rpm > most:
            problems.append(f"{f.name}: {f.rpm:.0f} calls/min, above the limit and its burst")
        if f.failed:
            problems.append(f"{f.name}: {f.failed} turns failed")
    return out, problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flow_cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rpm", type=float, default=1200.0, help="the group's limit")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds a phase")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds a phase")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    parser.add_argument("--short", action="store_true", help="CI: 4 s phases")
    args = parser.parse_args(argv)
    if args.short:
        args.seconds, args.warmup = 4.0, 1.0
    if args.rpm <= 0 or args.seconds <= 0 or args.sessions < 1:
        parser.error("--rpm, --seconds and --sessions must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dex-flow-cluster-") as tmp, database() as url:
        out, problems = asyncio.run(bench(args, Path(tmp), url))
    print("\n".join(out))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

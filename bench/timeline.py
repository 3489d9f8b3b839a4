"""Where a sequential turn's time goes, hop by hop.

    .venv/bin/python -m bench.timeline [--turns 300]

One session at a time sends a message and waits for its turn (model -> read tool ->
model, ``bench/timeline_agents.py``), as ``bench.turns`` does at one session, with the
server, the Worker and this client in three processes. Each turn is cut at moments
stamped with one clock (``time.time()``, the same machine): the client's send and
receipt, the server's stamps in the turn's record (the turn's ``started_at``; each
attempt's ``ended_at``, when the Worker's result is handled, before its commit), and
the Worker's entry into and exit from the model and the tool (the agent
notes them). The hops, per turn:

    client send -> server took the message   HTTP request in
    -> Worker entered the model               commit (message + hand-out), frame out, read
    model ran
    -> server handled the result              the result sent, the server reads it
    -> Worker entered the tool                commit (result + next hand-out), frame out, read
    ...
    -> client had the answer                  commit of the end, the long poll answered

It prints the median and p90 of each hop over the measured turns, and their sum beside
the median turn: the hop to cut is the widest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until_async

from .turns import commit_baseline, percentile, tailed_and_stopped

AGENTS_FILE = str(Path(__file__).with_name("timeline_agents.py").resolve())

AGENT = "bench"
TURNS_PER_SESSION = 20

HOPS = [
    ("HTTP request in (client send -> server took the message)", "send", "s0"),
    ("to the Worker (commit message + hand-out, frame out) -> model", "s0", "m1 in"),
    ("Worker: model 1", "m1 in", "m1 out"),
    ("back (result frame in) -> server handled it", "m1 out", "e1"),
    ("to the Worker (commit result + hand-out, frame out) -> tool", "e1", "tool in"),
    ("Worker: tool", "tool in", "tool out"),
    ("back (result frame in) -> server handled it", "tool out", "e2"),
    ("to the Worker (commit result + hand-out, frame out) -> model", "e2", "m2 in"),
    ("Worker: model 2", "m2 in", "m2 out"),
    ("back (result frame in) -> server handled it", "m2 out", "e3"),
    ("answer out (commit of the end, long poll answered)", "e3", "received"),
]


async def run(turns: int, warmup: int, tmp: Path) -> list[dict[str, float]]:
    notes = tmp / "notes.txt"
    notes.touch()
    server = ServerProcess(tmp / "data")
    worker = WorkerProcess(
        AGENTS_FILE, server.address, tmp / "worker.log", env={"DEX_BENCH_TIMELINE": str(notes)}
    )
    client_times: dict[str, tuple[float, float, dict[str, Any]]] = {}
    with tailed_and_stopped(server, worker):
        await asyncio.to_thread(server.start)
        worker.start()
        async with dex.Client(server.address) as client:

            async def registered() -> bool:
                return any(a["name"] == AGENT for a in await client.list_agents())

            await wait_until_async(registered, 20, 0.05, "the Worker registered its agent")
            session = ""
            for i in range(warmup + turns):
                if i % TURNS_PER_SESSION == 0:
                    session = (await client.create_session(AGENT))["id"]
                text = f"t{i}"
                sent = time.time()
                result = await client.send_message(session, text, wait=True)
                received = time.time()
                assert result["status"] == "completed", result
                if i >= warmup:
                    client_times[text] = (sent, received, result)
    worker_times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in notes.read_text().splitlines():
        kind, edge, at, text = line.split(" ", 3)
        worker_times[text][f"{kind} {edge}"].append(float(at))
    out = []
    for text, (sent, received, result) in client_times.items():
        w = worker_times[text]
        attempts = [s["attempts"][-1] for s in result["steps"]]
        if len(attempts) != 3 or len(w["model in"]) != 2 or len(w["tool in"]) != 1:
            raise RuntimeError(f"turn {text} is not model -> tool -> model: {result['steps']}")
        moments = {
            "send": sent,
            "s0": result["started_at"],
            "m1 in": w["model in"][0],
            "m1 out": w["model out"][0],
            "e1": attempts[0]["ended_at"],
            "tool in": w["tool in"][0],
            "tool out": w["tool out"][0],
            "e2": attempts[1]["ended_at"],
            "m2 in": w["model in"][1],
            "m2 out": w["model out"][1],
            "e3": attempts[2]["ended_at"],
            "received": received,
        }
        out.append(moments)
    return out


def report(moments: list[dict[str, float]], commit: list[float]) -> str:
    lines = [
        f"Dex turn timeline: {len(moments)} sequential turns (model -> read tool -> model), "
        "server, Worker and client in 3 processes, durable defaults",
        "",
        f"{'hop':<66} {'p50 ms':>7} {'p90 ms':>7} {'share':>6}",
    ]
    total_ms = statistics.median([m["received"] - m["send"] for m in moments]) * 1000
    medians = []
    for name, start, end in HOPS:
        gaps = [(m[end] - m[start]) * 1000 for m in moments]
        med = statistics.median(gaps)
        medians.append(med)
        lines.append(f"{name:<66} {med:7.3f} {percentile(gaps, 90):7.3f} {med / total_ms:6.0%}")
    lines.append("")
    lines.append(
        f"turn, client send to answer: p50 {total_ms:.3f} ms (the hops' medians sum to "
        f"{sum(medians):.3f} ms)"
    )
    back = sum(medians[i] for i in (3, 6, 9))
    out = sum(medians[i] for i in (1, 4, 7))
    lines.append(
        f"  Worker -> server (3 results in): {back:.3f} ms; server -> Worker (3 commits "
        f"and hand-outs): {out:.3f} ms; in the Worker's functions: "
        f"{sum(medians[i] for i in (2, 5, 8)):.3f} ms; HTTP in and out: "
        f"{medians[0] + medians[10]:.3f} ms"
    )
    lines.append(
        f"  baseline, same run: a bare durable commit (1 INSERT, WAL, synchronous=FULL) "
        f"p50 {statistics.median(commit) * 1000:.3f} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__)
    parser.add_argument("--turns", type=int, default=300, help="measured turns (default 300)")
    parser.add_argument("--warmup", type=int, default=40, help="turns before (default 40)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dex-timeline-") as tmp:
        commit = commit_baseline(Path(tmp))
        moments = asyncio.run(run(args.turns, args.warmup, Path(tmp)))
    print(report(moments, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())

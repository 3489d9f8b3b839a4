"""Flow control (issue #36): the server CPU that admission adds to a turn, and the rate a
limited model group achieves while its provider refuses calls.

    .venv/bin/python -m bench.flow                     # both parts, ~5 minutes
    .venv/bin/python -m bench.flow --part admission    # ~1.5 minutes
    .venv/bin/python -m bench.flow --part admission --rounds 0 --instructions 200
    .venv/bin/python -m bench.flow --part rate --scenario fraction
    .venv/bin/python -m bench.flow --short             # the form CI runs, < 60 s

**Admission.** ``bench.turns``'s workload (its ``Lane``s and ``run_phase``: model -> one
``read`` tool -> model, no-op bodies, 64 sessions) on two Dex Servers side by side, each
with its Worker: one with no limits, and one whose agent's model group has a limit that
never binds (calls at once above the Worker's capacity, requests and tokens per minute
far above what is reached) and whose tool has a concurrency key
(``bench/flow_agents.py``). Rounds alternate between the two, the order swapped every
round, so the machine's neighbours load both alike: the server's CPU per turn of each,
and their ratio (target <= 1.05). And, unmoved by the machine's load, the CPU of the
gates alone (``Limits``) for one turn's Steps, called in this process, with and without
those limits; with ``--instructions N``, the server's instructions per turn over N turns
with and without them, counted by callgrind (``bench.instructions``' ``measure``). The
limited server's sessions also belong to a tenant (``TENANT``) with a budget that never
binds: each model call checks it, and each model result adds to the tenant's day in its
commit (the callgrind figure too).

**Rate under refusals.** A model group with ``rpm`` = R (``--rpm``, 600), whose model is
``dex.models.Anthropic`` through the real SDK client against the local fake server
(``dex.testing.fake_providers.FakeAnthropic``, in this process) with a provider-side rate
limit (``RateLimit``): it refuses with HTTP 429 and Retry-After a set part of the calls
(``fraction``), or the calls over its own rate a little above R (``above``) or below it
(``below``). ``--sessions`` (50) sessions send their next message as soon as their turn
ended, for ``--seconds`` after a warm-up; the turns still waiting then are left
unfinished. It reports turns completed and failed, the attempts that refusals used (from
every ended turn's record: a RunModel Step whose call was refused must still succeed as
attempt 1), the refusals (the provider's count and the server's
``dex_attempts_total{outcome="rate_limited"}``), and the calls per minute the provider
received and served, against R. A run fails (exit 1) if a turn failed, a refusal used an
attempt, or more calls reached the provider from the first message on than R and the
gate's burst allow; missed timing targets do not fail it.

Everything lives in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import dex
from dex.server.dispatch.limits import BURST, Ask, Limit, Limits
from dex.testing import ServerProcess, WorkerProcess, wait_until_async
from dex.testing.fake_providers import FakeAnthropic, RateLimit, Reply

from . import flow_agents, instructions, turns
from .turns import machine_busy_seconds, metrics, render_table

BENCH = Path(__file__).resolve().parent
TURNS_AGENTS = BENCH / "agents.py"
FLOW_AGENTS = BENCH / "flow_agents.py"
SCRIPTED_GROUP = "scripted/scripted"
"""The model group of ``bench/agents.py``'s model (its provider and name)."""
NEVER = {"concurrency": 100_000, "rpm": 1e9, "tpm": 1e12}
"""Limits that never bind: far above what two CPUs can reach."""
TARGET_CPU_RATIO = 1.05
TARGET_RATE = 0.10
"""Served calls per minute within this part of R."""


def rate_limited(values: dict[str, float]) -> float:
    """Attempts the server ended as refused by the provider (``dex_attempts_total`` with
    ``outcome="rate_limited"``), of every Step type."""
    return sum(
        v
        for name, v in values.items()
        if name.startswith("dex_attempts_total{") and 'outcome="rate_limited"' in name
    )


# --- admission: what a limit that never binds costs ------------------------------------


@dataclass
class Arm:
    """One server of the admission figure, and its rounds."""

    name: str
    server: ServerProcess
    worker: WorkerProcess
    phases: list[turns.Phase] = field(default_factory=list)

    def cpu_per_turn(self) -> list[float]:
        return [p.cpu["server"] / max(p.turns, 1) for p in self.phases]


def arms(tmp: Path) -> list[Arm]:
    limited = {"DEX_MODEL_LIMITS": json.dumps({SCRIPTED_GROUP: NEVER})}
    found = []
    for name, agents_file, env in (
        ("no limits", TURNS_AGENTS, {}),
        ("limits", FLOW_AGENTS, limited),
    ):
        work = tmp / name.replace(" ", "-")
        server = ServerProcess(work / "data", env=env, heartbeat_timeout=60)
        worker = WorkerProcess(
            str(agents_file), server.address, work / "worker.log", capacity=turns.WORKER_CAPACITY
        )
        found.append(Arm(name, server, worker))
    return found


async def connected(
    http: aiohttp.ClientSession, server: ServerProcess, worker: WorkerProcess
) -> None:
    async def ready() -> bool:
        if not worker.alive:
            raise RuntimeError(f"the Worker exited:\n{worker.output()[-3000:]}")
        return (await metrics(http, server.address)).get("dex_workers_connected", 0) >= 1

    await wait_until_async(ready, 60, 0.05, "the Worker connected")


TENANT = "bench"
"""The tenant of the limited server's sessions; its budget never binds."""


class TenantClient:
    """A ``turns.TurnClient`` whose sessions all belong to ``TENANT``."""

    def __init__(self, client: dex.Client) -> None:
        self.client = client

    async def create_session(self, agent: str, session_id: str | None = None) -> dict[str, Any]:
        return await self.client.create_session(agent, session_id, tenant=TENANT)

    async def send_message(self, session_id: str, text: str, **options: Any) -> dict[str, Any]:
        return await self.client.send_message(session_id, text, **options)


async def admission(args: argparse.Namespace, tmp: Path) -> tuple[list[Arm], float]:
    """The interleaved rounds of both servers, and how many CPUs were busy meanwhile."""
    found = arms(tmp)
    with running(*found):
        for arm in found:
            await asyncio.to_thread(arm.server.start, timeout=60)
            arm.worker.start()
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession())
            clients = []
            for arm in found:
                await connected(http, arm.server, arm.worker)
                client = dex.Client(arm.server.address, connections=args.concurrency + 16)
                clients.append(await stack.enter_async_context(client))
            configured = {g["group"]: g["limit"] for g in await clients[1].get_limits()}
            if not configured.get(SCRIPTED_GROUP):
                raise RuntimeError(f"the limit of {SCRIPTED_GROUP} is not set: {configured}")
            await clients[1].set_tenant_budget(TENANT, max_tokens_per_day=1 << 60)
            lanes: list[turns.TurnClient] = [clients[0], TenantClient(clients[1])]
            busy0, t0 = machine_busy_seconds(), time.monotonic()
            for r in range(args.rounds):
                order = list(zip(found, lanes, strict=True))
                for arm, lane in order if r % 2 == 0 else order[::-1]:
                    phase = await turns.run_phase(
                        lane,
                        http,
                        arm.server,
                        arm.worker,
                        args.concurrency,
                        args.admission_seconds,
                        args.warmup,
                        args.turns_per_session,
                        None,
                    )
                    arm.phases.append(phase)
                    print(
                        f"  round {r + 1} {arm.name}: {phase.turns_per_s:.0f} turns/s, server "
                        f"{phase.cpu['server'] / max(phase.turns, 1) * 1e3:.3f} ms a turn, "
                        f"{not_ours(phase):.2f} CPUs busy with other processes",
                        flush=True,
                    )
            busy = (machine_busy_seconds() - busy0) / (time.monotonic() - t0)
    return found, busy


def admission_floor(limited: bool, turns: int = 20_000) -> float:
    """CPU seconds per turn of the gates alone, in this process: for each Step of a turn
    what the server asks of ``Limits`` (admit; a model call's usage settled; release),
    with the admission side's limits or without (where a model call still passes its
    group's gate, which holds no limit, and the tool asks nothing)."""
    limits = Limits(time.time)
    if limited:
        limits.set(SCRIPTED_GROUP, Limit(**NEVER))
    model = Ask(SCRIPTED_GROUP, tokens=40)
    tool = Ask("tool:bench/read=k", concurrency=flow_agents.TOOL_LIMIT) if limited else None
    steps = (("s1", model), ("s2", tool), ("s3", model))
    t0 = time.process_time()
    for i in range(turns):
        session = f"session-{i % 64}"
        for step, ask in steps:
            if ask is None:
                continue
            if limits.admit(session, step, ask) is not None:
                raise RuntimeError("a limit that never binds held a Step")
            if ask is model:
                limits.settle(session, step, 60)
            limits.release(session, step)
    return (time.process_time() - t0) / turns


async def admission_instructions(args: argparse.Namespace, tmp: Path) -> str:
    """The server's instructions per turn without limits and with them (and a tenant's
    budget), counted by callgrind (``bench.instructions``): a figure the machine's load
    does not move."""
    ns = argparse.Namespace(
        turns=args.instructions, concurrency=[args.instructions_sessions], worker=False, creations=0
    )
    limited = {"DEX_MODEL_LIMITS": json.dumps({SCRIPTED_GROUP: NEVER})}
    budget = (TENANT, {"max_tokens_per_day": 1 << 60})
    base, limits = [
        (
            await instructions.measure(
                code, None, ns, tmp, agents_file=file, server_env=env, tenant=tenant
            )
        )[0]
        for code, file, env, tenant in (
            ("instr-no-limits", TURNS_AGENTS, {}, None),
            ("instr-limits", FLOW_AGENTS, limited, budget),
        )
    ]
    without, with_limits = base.server / base.turns, limits.server / limits.turns
    return (
        f"  server instructions per turn (callgrind, {ns.concurrency[0]} at once, "
        f"{base.turns} turns each; bench.instructions): {without / 1e6:.3f} M without limits, "
        f"{with_limits / 1e6:.3f} M with: {with_limits / without:.3f}x"
    )


def not_ours(phase: turns.Phase) -> float:
    """CPUs the machine's other processes kept busy during the phase."""
    ours = phase.cpu["server"] + phase.cpu["worker"] + phase.cpu["client"]
    return max(0.0, phase.cpu["machine"] - ours) / phase.seconds


def admission_report(
    found: list[Arm], busy: float, floors: tuple[float, float], args: argparse.Namespace
) -> tuple[str, bool]:
    """The report, and whether every turn completed."""
    rows = []
    for arm in found:
        cpu = arm.cpu_per_turn()
        rates = [p.turns_per_s for p in arm.phases]
        rows.append(
            [
                arm.name,
                f"{statistics.median(cpu) * 1e3:.3f}",
                f"{min(cpu) * 1e3:.3f}-{max(cpu) * 1e3:.3f}",
                f"{statistics.median(rates):,.0f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                f"{statistics.median(not_ours(p) for p in arm.phases):.2f}",
                str(sum(p.turns for p in arm.phases)),
                str(sum(p.failed for p in arm.phases)),
            ]
        )
    base, limited = found
    base_cpu = statistics.median(base.cpu_per_turn())
    ratio = statistics.median(limited.cpu_per_turn()) / base_cpu
    pairs = [b / a for a, b in zip(base.cpu_per_turn(), limited.cpu_per_turn(), strict=True)]
    header = ["server", "CPU ms/turn", "(rounds)", "turns/s", "(rounds)", "other CPUs"]
    header += ["turns", "failed"]
    ok = not any(p.failed for arm in found for p in arm.phases)
    without, with_limits = floors
    out = [
        "",
        f"Admission: bench.turns' workload at {args.concurrency} sessions, {args.rounds} rounds of "
        f"{args.admission_seconds:g} s per server (after {args.warmup:g} s warm-up), "
        "interleaved;",
        f"  {os.cpu_count()} CPUs, {busy:.2f} of them busy on average. 'limits': model group "
        f"{SCRIPTED_GROUP} limited to {NEVER['concurrency']:,} calls at once, "
        f"{NEVER['rpm']:.0e} rpm and {NEVER['tpm']:.0e} tpm (never binding), and its tool",
        f"  'read' under concurrency key '{{key}}' (at most {flow_agents.TOOL_LIMIT:,} at once). "
        "CPU: the server process with its SQLite writer, medians (and each round's range);",
        "  other CPUs: those the machine's other processes kept busy meanwhile.",
        "",
        render_table(rows, header),
        "",
        f"  limits / no limits, server CPU per turn: {ratio:.3f}x the medians, "
        f"{statistics.median(pairs):.3f}x the median of each round's pair "
        f"({', '.join(f'{x:.3f}' for x in pairs)});",
        f"  target <= {TARGET_CPU_RATIO:g}x: {'MET' if ratio <= TARGET_CPU_RATIO else 'MISSED'}"
        " (the medians' ratio)",
        f"  the gates alone, in process (Limits.admit, settle, release for a turn's Steps): "
        f"{without * 1e6:.1f} us a turn without limits, {with_limits * 1e6:.1f} us with;",
        f"  the difference is {(with_limits - without) / base_cpu:.2%} of the server's CPU per "
        "turn without limits above",
    ]
    if not ok:
        for arm in found:
            for p in arm.phases:
                if p.failed:
                    out.append(f"  PROBLEM: {arm.name}: {p.failed} turns failed: {dict(p.errors)}")
    return "\n".join(out), ok


# --- the rate a limited group achieves under refusals ----------------------------------


RETRY_AFTER = 1.0
"""The Retry-After of the ``fraction`` scenario's refusals: Anthropic's least, in whole
seconds."""


@dataclass(frozen=True)
class Scenario:
    """How the fake provider refuses calls."""

    words: str
    fraction: float = 0.0
    """The part of the calls it refuses, each with a Retry-After of ``RETRY_AFTER``."""
    part: float | None = None
    """Its own rate limit, as a part of R (a bucket of 1 s, Retry-After until it admits)."""

    def limit(self, rpm: float) -> RateLimit:
        if self.part is None:
            return RateLimit(fraction=self.fraction, retry_after=RETRY_AFTER)
        return RateLimit(rpm=rpm * self.part, fraction=self.fraction)

    def ceiling(self, rpm: float) -> float:
        """The most calls per minute the provider serves a group that waits out every
        Retry-After: with ``fraction``, the calls between two refusals once a
        Retry-After."""
        if self.part is not None:
            return min(rpm, rpm * self.part)
        return min(rpm, 60 * (1 - self.fraction) / self.fraction / RETRY_AFTER)


SCENARIOS = {
    "fraction": Scenario(
        f"refuses every fifth call (20 %), Retry-After {RETRY_AFTER:g} s", fraction=0.2
    ),
    "above": Scenario("refuses the calls over its own rate of 1.1 R (a bucket of 1 s)", part=1.1),
    "below": Scenario("refuses the calls over its own rate of 0.9 R (a bucket of 1 s)", part=0.9),
}


@dataclass
class Counts:
    """The provider's counts at one moment."""

    at: float
    received: int
    served: int
    refused: int

    @staticmethod
    def of(provider: FakeAnthropic, limit: RateLimit) -> Counts:
        return Counts(time.monotonic(), len(provider.requests), limit.served, limit.refused)


@dataclass
class Rate:
    scenario: str
    rpm: float
    sessions: int
    turns: int = 0
    failed: int = 0
    extra_attempts: int = 0
    """Attempts of RunModel Steps besides a first one that succeeded."""
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    start: Counts | None = None
    end: Counts | None = None
    elapsed: float = 0.0
    """From the first message sent to the end of the measured seconds."""
    rate_limited: float = 0.0
    """Refusals the server counted by the end (``dex_attempts_total{outcome="rate_limited"}``):
    those of the provider, less any still on their way back."""
    lowered: float = 1.0

    def per_minute(self, what: str) -> float:
        assert self.start is not None and self.end is not None
        seconds = self.end.at - self.start.at
        count: int = getattr(self.end, what) - getattr(self.start, what)
        return count / seconds * 60

    def allowed(self) -> float:
        """The most calls the group's limit lets reach the provider over the run: its rate
        over the run's length, and the gate's burst."""
        return self.rpm / 60 * (self.elapsed + BURST) + 1

    def problems(self) -> list[str]:
        assert self.end is not None
        found = []
        if self.failed:
            found.append(f"{self.failed} turns failed: {dict(self.errors)}")
        if self.extra_attempts:
            found.append(f"refusals used {self.extra_attempts} attempts")
        if self.end.received > self.allowed():
            found.append(
                f"{self.end.received} calls reached the provider, more than the "
                f"{self.allowed():.0f} that {self.rpm:g} rpm allows in {self.elapsed:.1f} s"
            )
        return found


async def rate_lane(
    client: dex.Client, session_id: str, until: float, rate: Rate, timeout: float
) -> None:
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            turn = await client.send_message(session_id, "go", wait=True, timeout=timeout)
        except dex.DexError as e:
            rate.failed += 1
            rate.errors[f"{type(e).__name__}: {e}"[:120]] += 1
            await asyncio.sleep(0.1)
            continue
        if turn.get("status") != "completed" or turn.get("text") != "done":
            rate.failed += 1
            rate.errors[f"turn {turn.get('status')}: {turn.get('error')}"[:120]] += 1
            continue
        rate.turns += 1
        rate.latencies.append(time.monotonic() - t0)
        for step in turn["steps"]:
            if step["type"] == "RunModel":
                outcomes = [(a["number"], a["outcome"]) for a in step["attempts"]]
                rate.extra_attempts += len(outcomes) - (outcomes[-1:] == [(1, "succeeded")])


async def rate_scenario(scenario: str, args: argparse.Namespace, tmp: Path) -> Rate:
    limit = SCENARIOS[scenario].limit(args.rpm)
    provider = FakeAnthropic(lambda body: Reply("done", chunk_chars=64), rate_limit=limit)
    rate = Rate(scenario, args.rpm, args.sessions)
    work = tmp / f"rate-{scenario}"
    server = ServerProcess(
        work / "data",
        env={"DEX_MODEL_LIMITS": json.dumps({flow_agents.GROUP: {"rpm": args.rpm}})},
        heartbeat_timeout=60,
    )
    worker = WorkerProcess(
        str(FLOW_AGENTS), server.address, work / "worker.log", capacity=max(64, args.sessions)
    )
    with provider.in_thread(), running(Arm(scenario, server, worker)):
        await asyncio.to_thread(server.start, timeout=60)
        worker.start({"DEX_BENCH_PROVIDER": provider.base_url})
        async with (
            aiohttp.ClientSession() as http,
            dex.Client(server.address, connections=args.sessions + 8) as client,
        ):
            await connected(http, server, worker)
            sessions = [
                (await client.create_session(flow_agents.flow.name))["id"]
                for _ in range(args.sessions)
            ]
            before = await metrics(http, server.address)
            first = time.monotonic()
            start, until = first + args.warmup_rate, first + args.warmup_rate + args.seconds
            lanes = [
                asyncio.create_task(rate_lane(client, s, until, rate, args.seconds + 60))
                for s in sessions
            ]
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            rate.start = Counts.of(provider, limit)
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            rate.end = Counts.of(provider, limit)
            after = await metrics(http, server.address)
            # the turns still waiting are left to run on: the figures stop here
            for lane in lanes:
                lane.cancel()
            for done in await asyncio.gather(*lanes, return_exceptions=True):
                if isinstance(done, BaseException) and not isinstance(done, asyncio.CancelledError):
                    raise done
            rate.elapsed = rate.end.at - first
            rate.rate_limited = rate_limited(after) - rate_limited(before)
            groups = {g["group"]: g for g in await client.get_limits()}
            rate.lowered = float(groups.get(flow_agents.GROUP, {}).get("lowered_to", 1.0))
    return rate


def rate_report(rates: list[Rate], args: argparse.Namespace) -> tuple[str, bool]:
    """The report, and whether every scenario kept the promises (no problem)."""
    rows = []
    for r in rates:
        assert r.end is not None
        served = r.per_minute("served")
        rows.append(
            [
                r.scenario,
                str(r.turns),
                str(r.failed),
                str(r.extra_attempts),
                f"{r.end.refused} / {r.rate_limited:g}",
                f"{r.per_minute('received'):.0f}",
                f"{r.per_minute('refused'):.0f}",
                f"{served:.0f}",
                f"{served / r.rpm:.3f}",
                f"{served / SCENARIOS[r.scenario].ceiling(r.rpm):.3f}",
                f"{turns.percentile(r.latencies, 50):.2f}",
                f"{r.end.received} / {r.allowed():.0f}",
            ]
        )
    header = ["provider", "turns", "failed", "attempts used", "refusals (provider / server)"]
    header += ["received/min", "refused/min", "served/min", "served/R", "served/ceiling"]
    header += ["turn p50 s"]
    header += ["calls in run / allowed"]
    out = [
        "",
        f"Rate under refusals: model group '{flow_agents.GROUP}' limited to R = {args.rpm:g} rpm; "
        "dex.models.Anthropic through the real SDK client against",
        f"  the local fake server (FakeAnthropic); {args.sessions} sessions, each sends its next "
        f"message when its turn (one model call) ended; {args.seconds:g} s measured after "
        f"{args.warmup_rate:g} s.",
        "  The provider, in each scenario:",
        *(f"    {name}: {SCENARIOS[name].words}" for name in args.scenario),
        "",
        render_table(rows, header),
        "",
        "  attempts used: attempts of RunModel Steps other than one first attempt that "
        "succeeded (must be 0: a refusal uses none).",
        "  received, refused, served per minute: the provider's counts over the measured "
        "seconds; served/R is the rate the group achieved;",
        "  served/ceiling: over the most the provider serves a group that waits out every "
        "Retry-After (R, its own rate if lower, or",
        f"  with 'fraction' the 4 calls between two refusals once every {RETRY_AFTER:g} s).",
        "  calls in run / allowed: every call that reached the provider from the first message "
        "to the end of the measured seconds,",
        f"  and what R allows over that time with the gate's burst ({BURST:g} s).",
    ]
    ok = True
    for r in rates:
        served = r.per_minute("served") / r.rpm
        verdict = "MET" if abs(served - 1) <= TARGET_RATE else "MISSED"
        out.append(
            f"  {r.scenario}: served {served:.3f} R (target within {TARGET_RATE:.0%} of R: "
            f"{verdict}); the group's limits lowered to {r.lowered:.2f} at the end"
        )
        for problem in r.problems():
            ok = False
            out.append(f"  PROBLEM: {r.scenario}: {problem}")
    return "\n".join(out), ok


# --- main ---------------------------------------------------------------------------


@contextlib.contextmanager
def running(*found: Arm) -> Iterator[None]:
    """Print the tail of each process's log if the body fails; stop them all at the end."""
    try:
        yield
    except BaseException:
        for arm in found:
            for proc, name in ((arm.server, "server"), (arm.worker, "Worker")):
                if proc.proc is not None:
                    tail = proc.output()[-2000:]
                    print(f"--- {arm.name} {name} log (tail) ---\n{tail}", file=sys.stderr)
        raise
    finally:
        for arm in found:
            for proc in (arm.worker, arm.server):
                if proc.alive:
                    proc.kill()


async def bench(args: argparse.Namespace, tmp: Path) -> tuple[str, bool]:
    texts, ok = [], True
    if args.part in ("both", "admission"):
        if args.rounds:
            print("admission: two servers, interleaved rounds ...", flush=True)
            floors = (admission_floor(False), admission_floor(True))
            found, busy = await admission(args, tmp)
            text, fine = admission_report(found, busy, floors, args)
            texts.append(text)
            ok = ok and fine
        if args.instructions:
            print("admission: instructions per turn under callgrind ...", flush=True)
            texts.append(await admission_instructions(args, tmp))
    if args.part in ("both", "rate"):
        rates = []
        for scenario in args.scenario:
            print(f"rate: the provider {SCENARIOS[scenario].words} ...", flush=True)
            rates.append(await rate_scenario(scenario, args, tmp))
        text, fine = rate_report(rates, args)
        texts.append(text)
        ok = ok and fine
    return "\n".join(texts), ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flow", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--part", choices=["both", "admission", "rate"], default="both")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the form CI runs: 2 admission rounds of 2 s, the 'fraction' scenario for 12 s",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="admission rounds (default 5; 0: none)"
    )
    parser.add_argument(
        "--admission-seconds", type=float, default=5.0, help="per round and server (default 5)"
    )
    parser.add_argument("--concurrency", type=int, default=turns.TARGET_CONCURRENCY)
    parser.add_argument("--warmup", type=float, default=1.0, help="before each admission round")
    parser.add_argument("--turns-per-session", type=int, default=20)
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="TURNS",
        help="also count the server's instructions per turn with and without limits over "
        "TURNS turns under callgrind (needs valgrind; a few minutes)",
    )
    parser.add_argument(
        "--instructions-sessions", type=int, default=16, help="sessions at once under callgrind"
    )
    parser.add_argument("--rpm", type=float, default=600.0, help="the model group's R (600)")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="measured seconds per scenario (60)"
    )
    parser.add_argument(
        "--warmup-rate", type=float, default=5.0, help="seconds before the measured ones (5)"
    )
    parser.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        action="append",
        help="the provider's refusals (repeat for several; default: all three)",
    )
    args = parser.parse_args(argv)
    if args.short:
        args.rounds, args.admission_seconds, args.warmup = 2, 2.0, 0.5
        args.seconds, args.warmup_rate = 12.0, 2.0
        args.scenario = args.scenario or ["fraction"]
    args.scenario = args.scenario or list(SCENARIOS)
    if args.rounds < 0 or args.seconds <= 0 or args.rpm <= 0 or args.sessions < 1:
        parser.error("--seconds, --rpm and --sessions must be positive, --rounds not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dex-flow-") as tmp:
        text, ok = asyncio.run(bench(args, Path(tmp)))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""What tracing costs per turn on the server, off and on.

    .venv/bin/python -m bench.tracing [--turns 2000] [--server-cpu-ms 4.2]

Replays the commits of one ``bench.turns`` turn (model -> tool -> model: 7 commits, 3
hand-outs) through the domain's tracing hooks in this process: with tracing off (the
domain's ``if self.tracing is not None`` and nothing else), and on, with OpenTelemetry's
SDK and no exporter (what Dex itself adds; an exporter's cost is the exporter's). Prints
microseconds of CPU per turn and their share of a server CPU per turn given on the
command line (default: 4.2 ms, bench.turns at 64 sessions on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider

from dex.server.engine.state import (
    Attempt,
    Retry,
    SessionState,
    SessionStatus,
    Step,
    Turn,
    TurnStatus,
)
from dex.server.tracing import Tracing
from dex.wire import AttemptOutcome, StepStatus, StepType

TYPES = (StepType.RUN_MODEL, StepType.CALL_TOOL, StepType.RUN_MODEL)


def one_turn(number: int, hook: Callable[[SessionState, Turn | None], None]) -> None:
    """The 7 commits of a turn, each followed by ``hook(state, ended turn)``."""
    state = SessionState(id=f"s{number}", agent="bench", created_at=0.0)
    turn = Turn(number=1, started_at=1.0)
    state.turn, state.status = turn, SessionStatus.RUNNING
    now = 1.0
    for i, step_type in enumerate(TYPES, 1):
        step = Step(id=f"1.{i}", type=step_type, retry=Retry(), created_at=now)
        turn.steps.append(step)
        hook(state, None)  # queued (the turn's first commit starts it)
        step.status = StepStatus.RUNNING
        step.attempts.append(Attempt(number=1, worker_id="w", started_at=now))
        hook(state, None)  # handed out
        now += 0.001
        step.attempts[0].outcome, step.attempts[0].ended_at = AttemptOutcome.SUCCEEDED, now
        step.status, step.ended_at = StepStatus.SUCCEEDED, now
    turn.status, turn.ended_at = TurnStatus.COMPLETED, now
    state.turn, state.status = None, SessionStatus.IDLE
    hook(state, turn)  # ended


def measure(turns: int, tracing: Tracing | None) -> tuple[float, float]:
    """CPU seconds for ``turns`` turns, with the hooks and without."""

    def hook(state: SessionState, ended: Turn | None) -> None:
        # what Sessions._apply_locked and _after_commit do around each commit
        if tracing is not None:
            tracing.before_commit(state)
        if tracing is not None:
            tracing.after_commit(state, ended)
            turn = ended or state.turn
            if turn is not None and turn.steps and turn.steps[-1].attempts:
                tracing.traceparent(state.id, f"{state.id}/{turn.steps[-1].id}/1")

    def baseline(state: SessionState, ended: Turn | None) -> None:
        pass

    start = time.process_time()
    for n in range(turns):
        one_turn(n, hook)
    with_hooks = time.process_time() - start
    start = time.process_time()
    for n in range(turns):
        one_turn(n, baseline)
    without = time.process_time() - start
    return with_hooks, without


class _Domain:
    tracing: Tracing | None = None


def off_per_turn(commits: int = 1_000_000) -> float:
    """Tracing off is the domain's two checks per commit: timed alone (the replayed turn's
    own cost varies more than they cost)."""
    domain = _Domain()
    state = SessionState(id="s", agent="bench", created_at=0.0)
    start = time.process_time()
    for _ in range(commits):
        if domain.tracing is not None:
            domain.tracing.before_commit(state)
        if domain.tracing is not None:
            domain.tracing.after_commit(state, None)
    loop = time.process_time() - start
    start = time.process_time()
    for _ in range(commits):
        pass
    empty = time.process_time() - start
    return max(0.0, loop - empty) / commits * 7 * 1e6  # 7 commits per turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--server-cpu-ms", type=float, default=4.2)
    args = parser.parse_args()
    turns: int = args.turns
    server_cpu_ms: float = args.server_cpu_ms

    def per_turn(tracing: Tracing | None) -> float:
        runs = [measure(turns, tracing) for _ in range(7)]
        best = min(r[0] for r in runs) - min(r[1] for r in runs)
        return best / turns * 1e6

    off = off_per_turn()
    on = per_turn(Tracing(TracerProvider()))
    for name, cost in (("off", off), ("on (SDK, no exporter)", on)):
        share = cost / (server_cpu_ms * 1000) * 100
        print(f"tracing {name:22}  {cost:8.2f} us CPU per turn  {share:6.2f} % of the server's")


if __name__ == "__main__":
    main()

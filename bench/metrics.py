"""What the metrics cost per turn, beside the server's CPU per turn.

    .venv/bin/python -m bench.metrics

Times the metric updates one turn of ``bench.turns`` makes on the server (3 attempts
ended, 3 queue waits, 1 ended turn with 3 Steps and 1 tool call) in this process, and
prints them as a share of a server CPU per turn given on the command line (default: the
0.8 ms measured at 64 sessions, bench/README.md).
"""

from __future__ import annotations

import argparse
import time

from dex.server.engine.state import Retry, Step, ToolCall, Turn, TurnStatus
from dex.server.metrics import Metrics
from dex.wire import StepStatus, StepType, ToolCallStatus, ToolKind


def a_turn() -> Turn:
    steps = [
        Step(
            id=f"1.{i}",
            type=t,
            status=StepStatus.SUCCEEDED,
            retry=Retry(),
            created_at=0.0,
            ended_at=0.001,
        )
        for i, t in enumerate((StepType.RUN_MODEL, StepType.CALL_TOOL, StepType.RUN_MODEL), 1)
    ]
    call = ToolCall(
        id="1.1",
        model_call_id="c",
        name="lookup",
        arguments={},
        kind=ToolKind.READ,
        idempotency_key="s/1.1",
        status=ToolCallStatus.SUCCEEDED,
    )
    return Turn(
        number=1,
        started_at=0.0,
        ended_at=0.003,
        status=TurnStatus.COMPLETED,
        steps=steps,
        tool_calls=[call],
    )


def per_turn(turns: int) -> float:
    metrics = Metrics()
    turn = a_turn()
    started = time.process_time()
    for _ in range(turns):
        for step_type in ("RunModel", "CallTool", "RunModel"):
            metrics.attempt_ended(step_type, "succeeded")
            metrics.queue_wait.observe(0.0002, "model:bench")
        metrics.turn_ended(turn)
    return (time.process_time() - started) / turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50_000)
    parser.add_argument("--server-cpu-ms", type=float, default=0.8)
    args = parser.parse_args(argv)
    cost = per_turn(args.turns)
    share = cost * 1000 / args.server_cpu_ms
    print(f"metric updates per turn: {cost * 1e6:.1f} us of CPU ({args.turns} turns)")
    print(f"share of a {args.server_cpu_ms:g} ms server CPU per turn: {share:.1%}")
    print(f"target < 2%: {'met' if share < 0.02 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

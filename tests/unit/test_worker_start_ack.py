"""A single-attempt tool starts only on a timely answer to the Worker's own start ask:
never on a stray or late ``ok`` (from a node that paused and may have lost its lease)."""

from __future__ import annotations

import asyncio
import time

import dex
from dex.models import Scripted, say
from dex.wire import StepType
from dex.wire.server_frames import HeartbeatReply, Step
from dex.wire.worker_frames import Heartbeat, WorkerMessage
from dex.worker.history import HistoryCache
from dex.worker.runner import Attempt


class Origin:
    """The connection the attempt came on: what the runner sends on it."""

    address = "http://node"
    resume: str | None = "its-token"

    def __init__(self) -> None:
        self.histories = HistoryCache()
        self.sent: list[WorkerMessage] = []

    def send(self, message: WorkerMessage) -> None:
        self.sent.append(message)


@dex.tool
async def book(ctx: dex.ToolContext) -> str:
    return "booked"


AGENT = dex.Agent(name="a", model=Scripted(lambda history: say("x")), tools=[book])


def handout() -> Step:
    return Step(
        attempt_id="s/1.2/1",
        session_id="s",
        step_id="1.2",
        step_type=StepType.CALL_SINGLE_ATTEMPT_TOOL,
        attempt=1,
        agent="a",
        tool="book",
        call_id="1.1",
        idempotency_key="s/1.1",
        needs_start_ack=True,
    )


async def test_only_a_timely_answer_with_the_asks_seq_starts_the_tool() -> None:
    runner = dex.Worker([AGENT], "http://127.0.0.1:1")._runner
    origin = Origin()
    sent = origin.sent
    runner.start_window = 0.2
    attempt = Attempt(handout(), origin)
    attempt.started = asyncio.get_running_loop().create_future()
    runner.attempts[attempt.handout.attempt_id] = attempt
    asking = asyncio.create_task(runner.start_acknowledged(attempt))
    await asyncio.sleep(0)
    first_seq = _asked(sent)
    aid = attempt.handout.attempt_id
    runner.on_message(HeartbeatReply(status={aid: "ok"}), origin)  # a periodic beat's reply
    runner.on_message(HeartbeatReply(status={aid: "ok"}, seq=first_seq + 99), origin)
    runner.on_message(HeartbeatReply(status={aid: "ok"}, seq=first_seq), Origin())  # another node
    assert not attempt.started.done()
    attempt.start_sent = time.monotonic() - 1.0  # the answer comes back too late
    runner.on_message(HeartbeatReply(status={aid: "ok"}, seq=first_seq), origin)
    assert not attempt.started.done()
    while _asked(sent) == first_seq:  # no timely answer: it asks again
        await asyncio.sleep(0.01)
    runner.on_message(HeartbeatReply(status={aid: "ok"}, seq=_asked(sent)), origin)
    assert await asking is True


def _asked(sent: list[WorkerMessage]) -> int:
    """The ``seq`` of the last start ask."""
    last = sent[-1]
    assert isinstance(last, Heartbeat) and last.seq is not None
    return last.seq


async def test_a_stop_refuses_the_start() -> None:
    runner = dex.Worker([AGENT], "http://127.0.0.1:1")._runner
    origin = Origin()
    attempt = Attempt(handout(), origin)
    attempt.started = asyncio.get_running_loop().create_future()
    runner.attempts[attempt.handout.attempt_id] = attempt
    asking = asyncio.create_task(runner.start_acknowledged(attempt))
    await asyncio.sleep(0)
    runner.on_message(HeartbeatReply(status={attempt.handout.attempt_id: "stop"}), origin)
    assert await asking is False

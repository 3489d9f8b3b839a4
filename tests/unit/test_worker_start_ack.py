"""A single-attempt tool starts only on a timely answer to the Worker's own start ask:
never on a stray or late ``ok`` (from a node that paused and may have lost its lease)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import dex
from dex.models import Scripted, say
from dex.wire import StepType
from dex.wire.server_frames import HeartbeatReply, Step
from dex.worker.worker import _Attempt, _Link


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
    worker = dex.Worker([AGENT], "http://127.0.0.1:1")
    sent: list[dict[str, Any]] = []
    worker._send = sent.append  # type: ignore[method-assign,assignment]
    worker._start_window = 0.2
    attempt = _Attempt(handout())
    attempt.started = asyncio.get_running_loop().create_future()
    worker._attempts[attempt.handout.attempt_id] = attempt
    asking = asyncio.create_task(worker._start_acknowledged(attempt))
    await asyncio.sleep(0)
    first_seq = sent[-1]["seq"]
    link = _Link(ws=None, address="http://node", heartbeat_interval=1.0)  # type: ignore[arg-type]
    aid = attempt.handout.attempt_id
    worker._on_message(link, HeartbeatReply(status={aid: "ok"}))  # a periodic beat's reply
    worker._on_message(link, HeartbeatReply(status={aid: "ok"}, seq=first_seq + 99))
    assert not attempt.started.done()
    attempt.start_sent = time.monotonic() - 1.0  # the answer comes back too late
    worker._on_message(link, HeartbeatReply(status={aid: "ok"}, seq=first_seq))
    assert not attempt.started.done()
    while sent[-1]["seq"] == first_seq:  # no timely answer: it asks again
        await asyncio.sleep(0.01)
    worker._on_message(link, HeartbeatReply(status={aid: "ok"}, seq=sent[-1]["seq"]))
    assert await asking is True


async def test_a_stop_refuses_the_start() -> None:
    worker = dex.Worker([AGENT], "http://127.0.0.1:1")
    worker._send = lambda message: None  # type: ignore[method-assign]
    attempt = _Attempt(handout())
    attempt.started = asyncio.get_running_loop().create_future()
    worker._attempts[attempt.handout.attempt_id] = attempt
    asking = asyncio.create_task(worker._start_acknowledged(attempt))
    await asyncio.sleep(0)
    link = _Link(ws=None, address="http://node", heartbeat_interval=1.0)  # type: ignore[arg-type]
    worker._on_message(link, HeartbeatReply(status={attempt.handout.attempt_id: "stop"}))
    assert await asking is False

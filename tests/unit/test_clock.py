"""Durable deadlines are on the database's clock: a node whose own clock is behind still
fires a timer when the database says it is due, and the lease measures the offset."""

from __future__ import annotations

import asyncio
import time

from dex.server.clock import Clock
from dex.server.dispatch.dispatcher import Dispatcher


def test_the_offset_is_measured_at_the_middle_of_the_round_trip() -> None:
    clock = Clock()
    clock.observe(database_time=1_000.0, sent=899.0, received=901.0)
    assert clock.offset == 100.0


async def test_a_timer_fires_by_the_database_clock_not_the_hosts() -> None:
    clock = Clock()
    clock.offset = 100.0  # this host is 100 s behind the database
    dispatcher = Dispatcher(heartbeat_timeout=10, clock=clock)
    fired = asyncio.Event()

    async def fire(session_id: str, step_id: str) -> None:
        fired.set()

    async def never(*args: object) -> None:
        raise AssertionError("nothing is handed out or expired here")

    dispatcher.start(never, never, fire)
    try:
        # due in 50 s by this host's clock, 50 s ago by the database's: it fires now
        dispatcher.arm_timer("s1", "1.3", time.time() + 50)
        await asyncio.wait_for(fired.wait(), 5)
    finally:
        await dispatcher.stop()

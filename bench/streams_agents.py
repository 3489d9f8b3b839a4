"""The streams benchmark's agent: a model that streams the time it emits each delta.

The user's message is ``COUNT INTERVAL_MS``: the model yields COUNT deltas, INTERVAL_MS
apart, each the wall-clock time in nanoseconds and a ``;``. A subscriber subtracts it from
the time it reads the delta: the latency from the Worker's emit to the client. The Worker
may send several deltas in one frame; each keeps its own stamp. The Worker loads this
module (``dex worker bench/streams_agents.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import dex
from dex.models import Model, ModelRequest
from dex.wire import ModelResponse, UserItem


class Ticker(Model):
    def spec(self) -> dict[str, Any]:
        return {"provider": "bench", "name": "ticker"}

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        message = request.history[-1]
        assert isinstance(message, UserItem)
        count, interval_ms = (int(v) for v in message.text.split())
        for _ in range(count):
            await asyncio.sleep(interval_ms / 1000)
            yield f"{time.time_ns()};"
        yield ModelResponse(text=f"{count} stamps")


ticker = dex.Agent(name="ticker", model=Ticker(), instructions="Benchmark.")

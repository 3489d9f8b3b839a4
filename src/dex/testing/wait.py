"""Wait on a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> T:
    """Call ``condition`` until it returns something truthy; return that, or raise on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {timeout}s: {what or condition}")
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "",
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {timeout}s: {what or condition}")
        await asyncio.sleep(interval)

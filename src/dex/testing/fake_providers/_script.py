"""What a fake provider plays: scripted replies and failures, and what it records."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of a scripted reply. A ``str`` ``arguments`` is sent as it is, so a
    test can send argument text that is not valid JSON."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def argument_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@dataclass(frozen=True)
class Reply:
    """A model response: text, then tool calls, streamed in chunks of ``chunk_chars``."""

    text: str = ""
    tool_calls: Sequence[ScriptedCall] = ()
    stop_reason: str | None = None
    """``end_turn``, ``tool_use`` or ``max_tokens``; by default ``tool_use`` when there are
    tool calls, else ``end_turn``. Sent in each provider's own words."""
    input_tokens: int = 21
    output_tokens: int = 13
    chunk_chars: int = 5
    drop_after: int | None = None
    truncate_after: int | None = None
    pause_after: int | None = None
    resume: asyncio.Event | None = None

    @property
    def stop(self) -> str:
        return self.stop_reason or ("tool_use" if self.tool_calls else "end_turn")

    def text_chunks(self) -> list[str]:
        return _chunks(self.text, self.chunk_chars)

    def argument_chunks(self, call: ScriptedCall) -> list[str]:
        return _chunks(call.argument_text(), self.chunk_chars)


@dataclass(frozen=True)
class Fail:
    """An error: HTTP ``status`` with the provider's error body, or (``in_stream``) an
    HTTP 200 stream that reports the error after it began."""

    status: int
    message: str = "scripted failure"
    error_type: str | None = None
    """The provider's error type; by default the one the provider uses for ``status``."""
    headers: Mapping[str, str] = field(default_factory=dict)
    in_stream: bool = False


Entry = Reply | Fail
Script = Sequence[Entry] | Callable[[dict[str, Any]], Entry]


class RateLimit:
    """A provider's rate limit: refuse a request with HTTP 429 and ``Retry-After`` when
    requests come faster than ``rpm`` per minute (a bucket of ``burst`` seconds of it, as
    the providers' token buckets are), and also, with ``fraction``, that part of the
    requests it lets through, spread evenly (0.2: every fifth). ``retry_after`` is the
    seconds the refusal asks to wait; None: until the bucket admits again, rounded up to
    whole seconds as Anthropic sends it (and 1 for a refusal of ``fraction``).

    ``served`` and ``refused`` count what it decided (read them from any thread)."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        burst: float = 1.0,
        fraction: float = 0.0,
        retry_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= fraction < 1:
            raise ValueError("fraction must be in [0, 1)")
        self.rpm = rpm
        self.burst = burst
        self.fraction = fraction
        self.retry_after = retry_after
        self.clock = clock
        self.served = 0
        self.refused = 0
        self._at = 0.0  # when the requests let through so far would have come at the rate
        self._passed = 0  # requests the bucket let through, for ``fraction``

    def refuse(self) -> float | None:
        """Whether to refuse the request arriving now: the Retry-After to send, or None."""
        now = self.clock()
        wait: float | None = None
        if self.rpm is not None and self._at > now + self.burst:
            wait = self._at - self.burst - now
        else:
            if self.rpm is not None:
                self._at = max(self._at, now) + 60 / self.rpm
            self._passed += 1
            n = self._passed
            if math.floor(n * self.fraction) > math.floor((n - 1) * self.fraction):
                wait = 1.0
        if wait is None:
            self.served += 1
            return None
        self.refused += 1
        return self.retry_after if self.retry_after is not None else max(1.0, math.ceil(wait))


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]

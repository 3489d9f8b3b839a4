"""What a fake provider plays: scripted replies and failures, and what it records."""

from __future__ import annotations

import asyncio
import json
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


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]

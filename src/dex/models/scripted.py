"""A scripted model for tests and demos: its response depends only on the history.

A rerun of the same RunModel therefore gives the same response, which is what
makes crash tests exact. It can also be told to fail, hang or stream slowly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from dex.models.base import Model, ModelError, ModelRequest
from dex.wire import Item, ModelResponse, ModelToolCall, Summary, SummaryItem, UserItem

Respond = Callable[[list[Item]], ModelResponse | str]


def say(text: str) -> ModelResponse:
    """A final answer."""
    return ModelResponse(text=text)


def call(name: str, call_id: str = "call_1", /, **arguments: Any) -> ModelToolCall:
    """One tool call, for ``ModelResponse(tool_calls=[...])``."""
    return ModelToolCall(id=call_id, name=name, arguments=arguments)


class Scripted(Model):
    def __init__(
        self,
        respond: Respond,
        *,
        chunk_chars: int = 0,
        delay_per_chunk: float = 0.0,
        fail_attempts: int = 0,
        hang: bool = False,
        name: str = "scripted",
        summarize: Callable[[list[Item]], str] | None = None,
        fail_summaries: bool = False,
        group: str | None = None,
    ) -> None:
        """``chunk_chars`` > 0 streams the text in chunks of that size, ``delay_per_chunk``
        apart. ``fail_attempts`` makes attempts 1..n fail (retryably); ``hang`` never answers.
        ``summarize`` writes CompactContext summaries (default: a deterministic digest);
        ``fail_summaries`` makes every summary attempt fail. ``group``: the model group
        its calls count against (default ``scripted/NAME``)."""
        self.respond = respond
        self.chunk_chars = chunk_chars
        self.delay_per_chunk = delay_per_chunk
        self.fail_attempts = fail_attempts
        self.hang = hang
        self.name = name
        self._summarize = summarize or _digest
        self.fail_summaries = fail_summaries
        self.group = group

    def spec(self) -> dict[str, Any]:
        spec = {"provider": "scripted", "name": self.name}
        if self.group is not None:
            spec["group"] = self.group
        return spec

    async def summarize(self, request: ModelRequest) -> Summary:
        if self.fail_summaries:
            raise ModelError(
                f"scripted summary failure on attempt {request.attempt}", retryable=True
            )
        return Summary(text=self._summarize(request.history))

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        if request.attempt <= self.fail_attempts:
            raise ModelError(f"scripted failure on attempt {request.attempt}", retryable=True)
        if self.hang:
            await asyncio.Event().wait()
        response = self.respond(request.history)
        if isinstance(response, str):
            response = ModelResponse(text=response)
        text = response.text
        if self.chunk_chars > 0 and text:
            for i in range(0, len(text), self.chunk_chars):
                if self.delay_per_chunk:
                    await asyncio.sleep(self.delay_per_chunk)
                yield text[i : i + self.chunk_chars]
        elif text:
            yield text
        yield response


def _digest(history: list[Item]) -> str:
    """A deterministic summary: how much there was, and what the user asked."""
    asked = [item.text for item in history if isinstance(item, UserItem)]
    earlier = [item.text for item in history if isinstance(item, SummaryItem)]
    parts = [f"Summary of {len(history)} items."]
    if earlier:
        parts.append(f"Before that: {earlier[-1]}")
    if asked:
        parts.append("The user said: " + " | ".join(asked))
    return " ".join(parts)

"""The interface every model provider implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from dex.errors import DexError
from dex.wire import Item, ModelResponse, Summary, ToolSpec, UserItem


class ModelError(DexError):
    """A model call failed. ``retryable`` says whether another attempt may help."""

    code = "model_error"


class RateLimited(ModelError):
    """The provider refused the call for its rate limit or for load (HTTP 429, Anthropic's
    529 overloaded): nothing ran. The Worker hands the Step back, and the server queues
    it again without using an attempt, after ``retry_after`` seconds (the provider's
    ``Retry-After``) or else a backoff that doubles with each refusal in a row. A model of
    your own raises it the same way."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, **details: Any) -> None:
        super().__init__(message, retryable=True, **details)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ModelRequest:
    session_id: str
    agent: str
    instructions: str
    history: list[Item]
    tools: list[ToolSpec]
    attempt: int


class Model(ABC):
    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """Plain data naming this model and its settings (never a key): stored by the server."""

    @abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield text deltas as they arrive, then exactly one ``ModelResponse``."""

    def warm_up(self) -> None:
        """Pay one-time costs (lazy imports, schema building) before any Step runs. The
        Worker calls it before it connects: a first call that blocks the event loop would
        starve the heartbeats of every attempt the Worker holds."""
        return None

    async def aclose(self) -> None:
        """Release what the model holds (an SDK client's connections). The Worker calls it
        when it stops."""
        return None

    async def summarize(self, request: ModelRequest) -> Summary:
        """Summarize ``request.history`` for a CompactContext Step: by default, the same
        model asked for a summary, without tools."""
        ask = replace(
            request,
            instructions=SUMMARY_INSTRUCTIONS,
            history=[*request.history, UserItem(text=SUMMARY_REQUEST)],
            tools=[],
        )
        response: ModelResponse | None = None
        async for event in self.stream(ask):
            if isinstance(event, ModelResponse):
                response = event
        if response is None or not response.text:
            raise ModelError("the model returned no summary", retryable=True)
        return Summary(text=response.text, usage=response.usage)


SUMMARY_INSTRUCTIONS = (
    "You compress conversations. Write a faithful summary of the conversation so far: the "
    "user's goals, decisions, facts learned, tool calls made and their outcomes (say which "
    "succeeded, failed, or have an unknown outcome), and what is still open."
)
SUMMARY_REQUEST = "Summarize the conversation so far, as instructed."

"""The interface every model provider implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from dex.errors import DexError
from dex.wire import Item, ModelResponse, ToolSpec


class ModelError(DexError):
    """A model call failed. ``retryable`` says whether another attempt may help."""

    code = "model_error"


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

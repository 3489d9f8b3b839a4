"""Model providers. Each turns a session's history into a streamed ``ModelResponse``.

``Anthropic`` and ``OpenAI`` are imported on first use, so ``import dex`` works
without their SDKs installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dex.models.base import Model, ModelError, ModelRequest, RateLimited
from dex.models.scripted import Scripted, call, say

if TYPE_CHECKING:
    from dex.models.anthropic import Anthropic
    from dex.models.openai import OpenAI

__all__ = [
    "Anthropic",
    "Model",
    "ModelError",
    "ModelRequest",
    "OpenAI",
    "RateLimited",
    "Scripted",
    "call",
    "say",
]


def __getattr__(name: str) -> Any:
    if name == "Anthropic":
        from dex.models.anthropic import Anthropic

        return Anthropic
    if name == "OpenAI":
        from dex.models.openai import OpenAI

        return OpenAI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

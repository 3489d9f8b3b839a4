"""An agent: a name, a model, instructions and tools, defined in Worker code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dex.models.base import Model
from dex.tools import Tool
from dex.wire import AgentSpec, RetryPolicy


@dataclass(frozen=True)
class Agent:
    name: str
    model: Model
    instructions: str = ""
    tools: Sequence[Tool] = ()
    model_retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How often RunModel may be attempted: 3 attempts within 30 minutes by default."""
    compact_threshold_chars: int | None = None
    """Summarize the history (a CompactContext Step) before a model call once the history
    since the last summary holds more than this many characters. None: never."""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.name!r} has two tools named {sorted(duplicates)}")

    def spec(self) -> AgentSpec:
        return AgentSpec(
            name=self.name,
            model=self.model.spec(),
            instructions=self.instructions,
            tools=[t.spec() for t in self.tools],
            model_retry=self.model_retry,
            compact_threshold_chars=self.compact_threshold_chars,
        )

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

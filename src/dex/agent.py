"""An agent: a name, a model, instructions and tools, defined in Worker code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dex.models.base import Model
from dex.tools import Tool, ToolSource
from dex.wire import AgentSpec, OnBusy, RetryPolicy


@dataclass(frozen=True)
class Agent:
    name: str
    model: Model
    instructions: str = ""
    tools: Sequence[Tool | ToolSource] = ()
    """Tools, and sources of tools listed when the Worker starts (``dex.mcp_tools``)."""
    model_retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How often RunModel may be attempted: 3 attempts within 30 minutes by default."""
    compact_threshold_chars: int | None = None
    """Summarize the history (a CompactContext Step) before a model call once the history
    since the last summary holds more than this many characters. None: never."""
    on_busy: OnBusy = "enqueue"
    """What a user message does while a turn of the session runs, unless its send says
    otherwise (docs/mid-turn.md): ``enqueue`` (wait for the turn to end), ``reject`` (a
    409), ``interrupt`` (cancel the turn, start one with the message), ``steer`` (join
    the turn: its next model call sees the message)."""

    def __post_init__(self) -> None:
        self._check([t for t in self.tools if isinstance(t, Tool)])

    def _check(self, tools: list[Tool]) -> None:
        names = [t.name for t in tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.name!r} has two tools named {sorted(duplicates)}")

    @property
    def sources(self) -> list[ToolSource]:
        """The sources among its tools (their tools are listed when a Worker starts)."""
        return [t for t in self.tools if not isinstance(t, Tool)]

    def all_tools(self) -> list[Tool]:
        """Its tools, each source's as listed (``RuntimeError`` before they are)."""
        tools: list[Tool] = []
        for t in self.tools:
            tools += [t] if isinstance(t, Tool) else t.listed()
        return tools

    def check_tools(self) -> None:
        """``ValueError`` if two of its tools, listed sources' too, share a name."""
        self._check(self.all_tools())

    def spec(self) -> AgentSpec:
        return AgentSpec(
            name=self.name,
            model=self.model.spec(),
            instructions=self.instructions,
            tools=[t.spec() for t in self.all_tools()],
            model_retry=self.model_retry,
            compact_threshold_chars=self.compact_threshold_chars,
            on_busy=self.on_busy,
        )

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.all_tools() if t.name == name), None)

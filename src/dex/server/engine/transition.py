"""What a handler returns, and the history it appends to: a handler mutates the session
state it was given and lists in a ``Transition`` what else must be written and what must
happen once the commit is durable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dex.server.engine.state import Sent, SessionState, Step, ToolCall, Turn
from dex.wire import AssistantItem, Item, ToolResultItem


@dataclass
class Transition:
    history: list[Item] = field(default_factory=list)
    ready: list[Step] = field(default_factory=list)
    """Steps that became queued and may be handed to a Worker."""
    timers: list[Step] = field(default_factory=list)
    """AwaitTimer Steps to arm."""
    ended_turn: Turn | None = None
    cancel: list[str] = field(default_factory=list)
    """Attempt ids whose Worker should stop."""
    events: list[dict[str, Any]] = field(default_factory=list)
    sent: Sent | None = None
    """For a user message: what it did, and the turn that answers it."""
    unknown: list[tuple[ToolCall, Step]] = field(default_factory=list)
    """Tool calls whose outcome became unknown, each with its failed Step (to be logged)."""
    used: tuple[int, int, float] | None = None
    """What a model call whose result this commits used (input tokens, output tokens, cost),
    for its tenant's usage (``dex.server.flow.TenantBudgets``)."""


def merge(into: Transition, other: Transition) -> None:
    into.history.extend(other.history)
    into.ready.extend(other.ready)
    into.timers.extend(other.timers)
    into.cancel.extend(other.cancel)
    into.events.extend(other.events)
    into.unknown.extend(other.unknown)
    if other.used is not None:
        into.used = other.used
    if other.ended_turn is not None:
        into.ended_turn = other.ended_turn


def append_history(state: SessionState, t: Transition, item: Item) -> None:
    t.history.append(item)
    chars = item_size(item)
    state.context_chars += chars
    if state.turn is not None:
        state.turn.history_chars += chars


def item_size(item: Item) -> int:
    """About how many characters the item adds to what the model reads (for compaction):
    cheap, as it runs for every item."""
    if isinstance(item, AssistantItem):
        return len(item.text) + sum(len(c.name) + len(str(c.arguments)) for c in item.tool_calls)
    if isinstance(item, ToolResultItem):
        return len(item.name) + len(str(item.result)) + len(item.error or "")
    return len(item.text)

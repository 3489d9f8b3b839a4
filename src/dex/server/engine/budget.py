"""What model calls cost, what a session has used, and the budget it may not pass.

A model call's usage (the tokens its provider reported) is added to its turn's and its
session's totals in the commit that records the call's result, so a crash never counts
one call twice nor loses a committed one. A call whose result never committed (its
attempt failed: a crash, a timeout) consumed tokens that its provider knows and Dex does
not: they are not counted (docs/flow-control.md, Budgets).

Its cost is its tokens times the price of the agent's model (``Prices``: per million
input and output tokens, in US dollars); a model the table does not know costs nothing,
and its tokens still count.

A budget limits the session's total tokens, its cost, or both. A turn whose next model
call (``RunModel``, ``CompactContext``) would start at or over the budget waits for it in
an ``AwaitBudget`` Step (``turn.call_model``) until a person raises or removes the budget
(``handlers.set_budget``) or cancels the turn. Nothing runs meanwhile.

A tenant's budget (``TenantBudget``) limits what all its sessions use in a UTC day and in
a UTC month. Its usage is counted by day in the commit of each model result
(``dex.server.flow.TenantBudgets``), and a turn whose next model call would start with the
tenant's day or month used up waits in the same ``AwaitBudget`` Step, its ``Wait.tenant``
set, until the tenant's budget is raised or removed, or the day or month it is over ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


class Price(msgspec.Struct, kw_only=True, frozen=True):
    """US dollars per million tokens."""

    input: float
    output: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


FREE = Price(input=0.0, output=0.0)

DEFAULT_PRICES: dict[str, Price] = {
    # Anthropic (USD per million tokens: input, output)
    "claude-opus-4-5": Price(input=5.0, output=25.0),
    "claude-opus-4-1": Price(input=15.0, output=75.0),
    "claude-opus-4": Price(input=15.0, output=75.0),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0),
    "claude-sonnet-4": Price(input=3.0, output=15.0),
    "claude-3-7-sonnet": Price(input=3.0, output=15.0),
    "claude-haiku-4-5": Price(input=1.0, output=5.0),
    "claude-3-5-haiku": Price(input=0.8, output=4.0),
    "claude-3-haiku": Price(input=0.25, output=1.25),
    # OpenAI
    "gpt-5": Price(input=1.25, output=10.0),
    "gpt-5-mini": Price(input=0.25, output=2.0),
    "gpt-5-nano": Price(input=0.05, output=0.4),
    "gpt-4.1": Price(input=2.0, output=8.0),
    "gpt-4.1-mini": Price(input=0.4, output=1.6),
    "gpt-4.1-nano": Price(input=0.1, output=0.4),
    "gpt-4o": Price(input=2.5, output=10.0),
    "gpt-4o-mini": Price(input=0.15, output=0.6),
    "o3": Price(input=2.0, output=8.0),
    "o3-mini": Price(input=1.1, output=4.4),
    "o4-mini": Price(input=1.1, output=4.4),
}
"""The prices Dex ships (the providers' list prices when this version was made, without
caching or batch discounts); the server's ``prices`` setting overrides or adds models."""


class Prices:
    """A price table: a model's price by its name, or by the longest name in the table that
    starts its name followed by ``-`` (``claude-sonnet-4-5-20250929`` is priced as
    ``claude-sonnet-4-5``, ``gpt-4o-mini-2024-07-18`` as ``gpt-4o-mini``)."""

    def __init__(self, table: Mapping[str, Price] = DEFAULT_PRICES) -> None:
        self.table = dict(table)
        self._found: dict[str, Price] = {}

    def of(self, model: str) -> Price:
        found = self._found.get(model)
        if found is None:
            found = self.table.get(model)
            if found is None:
                names = [n for n in self.table if model.startswith(n + "-")]
                found = self.table[max(names, key=len)] if names else FREE
            self._found[model] = found
        return found

    def for_spec(self, model: Mapping[str, Any]) -> Price:
        """The price of an agent's model, as its spec names it (``AgentSpec.model``)."""
        return self.of(model_name(model))


def model_name(model: Mapping[str, Any]) -> str:
    """The model an agent's spec names (``{"provider": ..., "model": ...}``); for a model
    with no such field (the scripted one), its provider."""
    name = model.get("model") or model.get("name") or model.get("provider") or ""
    return str(name)


class Usage(msgspec.Struct, kw_only=True):
    """Tokens and cost of the model calls whose results committed."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost_usd += cost_usd
        self.calls += 1

    def __iadd__(self, other: Usage) -> Usage:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd
        self.calls += other.calls
        return self


class Budget(msgspec.Struct, kw_only=True, frozen=True):
    """What a session may use in all: tokens (input and output), US dollars, or both. A
    limit left None does not apply."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None

    def reached(self, usage: Usage) -> str | None:
        """Why a model call may not start with this usage (in words); None if it may."""
        if self.max_tokens is not None and usage.tokens >= self.max_tokens:
            return f"{usage.tokens} tokens used of a budget of {self.max_tokens}"
        if self.max_cost_usd is not None and usage.cost_usd >= self.max_cost_usd:
            return f"${usage.cost_usd:.6f} used of a budget of ${self.max_cost_usd:g}"
        return None


class TenantBudget(msgspec.Struct, kw_only=True, frozen=True):
    """What all of a tenant's sessions may use in a day and in a month (UTC), in tokens
    (input and output) or US dollars. A limit left None does not apply."""

    max_tokens_per_day: int | None = None
    max_cost_usd_per_day: float | None = None
    max_tokens_per_month: int | None = None
    max_cost_usd_per_month: float | None = None

    def reached(self, tenant: str, today: Usage, month: Usage) -> str | None:
        """Why a model call of the tenant's may not start with this usage (in words); None
        if it may."""
        for used, tokens, cost, period in (
            (today, self.max_tokens_per_day, self.max_cost_usd_per_day, "today"),
            (month, self.max_tokens_per_month, self.max_cost_usd_per_month, "this month"),
        ):
            if tokens is not None and used.tokens >= tokens:
                return f"tenant {tenant}: {used.tokens} tokens used {period} of {tokens}"
            if cost is not None and used.cost_usd >= cost:
                return f"tenant {tenant}: ${used.cost_usd:.6f} used {period} of ${cost:g}"
        return None


def record_usage(
    session: Usage, turn: Usage, usage: Mapping[str, int], price: Price
) -> tuple[int, int, float]:
    """Add one committed model call's usage to its session's and turn's totals; returns
    what it used (input tokens, output tokens, cost). A negative count (a Worker's
    mistake) counts as none: usage only grows."""
    input_tokens = max(0, int(usage.get("input_tokens", 0)))
    output_tokens = max(0, int(usage.get("output_tokens", 0)))
    cost = price.cost(input_tokens, output_tokens)
    session.add(input_tokens, output_tokens, cost)
    turn.add(input_tokens, output_tokens, cost)
    return input_tokens, output_tokens, cost

"""Flow control's domain: the model limits a node enforces (``dex.server.dispatch.limits``),
from its server config and from storage, and the tenants' budgets (``TenantBudgets``).

A limit set at run time (the API, ``dex limits set``) is stored, and replaces the server
config's limit of that group; cleared, the config's applies again. Every node of a
cluster reads the stored limits every ``FOLLOW`` seconds, so a change made on one reaches
all within that; the node that made it applies it at once.

In a cluster the nodes share each group's limits by demand: every ``FOLLOW`` seconds each
node reports its calls running and waiting per limited group and reads the others'
(``share_by_demand``). A node admits ``DEMAND`` of the limits in proportion to its part
of the group's demand, and the rest in proportion to its part of the partitions (so a
node whose demand was nil still starts calls until the next report). The shares sum to
one however the sessions are spread over the nodes; without demand, each node admits its
part of the partitions.
"""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec

from dex.server.dispatch.limits import Limit as Limit
from dex.server.dispatch.limits import Limits
from dex.server.engine.budget import TenantBudget as TenantBudget
from dex.server.engine.budget import Usage
from dex.server.store.base import Store, TenantUsage, Write

log = logging.getLogger("dex.flow")

FOLLOW = 2.0
"""Seconds between two reads of the stored limits (and of the demand) by each node of a
cluster."""
DEMAND = 0.9
"""The part of a group's limits the nodes share by their demand (the rest, by partitions)."""
STALE = 3 * FOLLOW
"""A node's report of demand older than this is ignored: the node stopped."""


class ModelLimits:
    def __init__(self, store: Store, limits: Limits, configured: Mapping[str, Limit]) -> None:
        self.store = store
        self.limits = limits
        self.configured = dict(configured)
        """The server config's limits, by group."""
        self.stored: dict[str, Limit] = {}
        """The limits set at run time, by group."""
        self.node_id: Callable[[], str | None] = lambda: None
        """This node's id in the cluster (None: no cluster, or not joined yet)."""

    async def load(self) -> None:
        """Read the stored limits and enforce them over the config's."""
        rows = await self.store.load_limits()
        self.stored = {group: Limit.model_validate_json(spec) for group, spec in rows}
        self.limits.replace({**self.configured, **self.stored})

    async def follow(self) -> None:
        """Read the stored limits again every ``FOLLOW`` seconds (a cluster's other nodes
        change them too), until cancelled."""
        while True:
            await asyncio.sleep(FOLLOW)
            try:
                await self.load()
                await self.share_by_demand()
            except Exception as e:  # storage away for a moment: read them next time
                log.warning("could not read the limits: %r", e, extra={"action": "limits.read"})

    async def share_by_demand(self) -> None:
        """Report this node's demand on each limited group, read the other nodes', and
        take the share of each group's limits that follows (``Limits.shares``)."""
        node = self.node_id()
        if node is None:
            return
        tally = self.limits.tally()
        own = {g: sum(tally.get(g, (0, 0))) for g in self.limits.configured}
        now = self.limits.now()
        rows = await self.store.exchange_demand(node, own, now, now - STALE)
        if rows is None:
            return
        others: dict[str, int] = {}
        for _, group, demand in rows:
            others[group] = others.get(group, 0) + demand
        partitions = self.limits.share()
        shares = {}
        for group, mine in own.items():
            total = mine + others.get(group, 0)
            if total:
                shares[group] = DEMAND * mine / total + (1 - DEMAND) * partitions
        self.limits.shares = shares

    async def set(self, group: str, limit: Limit) -> None:
        """Store and enforce ``group``'s limits (``Limit()``: none, whatever the config says)."""
        await self.store.write(Write(limits=[(group, limit.model_dump_json(exclude_none=True))]))
        self.stored[group] = limit
        self.limits.set(group, limit)

    async def clear(self, group: str) -> None:
        """Drop the limits set at run time for ``group``: the config's apply again."""
        await self.store.write(Write(limits=[(group, None)]))
        self.stored.pop(group, None)
        self.limits.set(group, self.configured.get(group))

    def view(self) -> list[dict[str, object]]:
        """Each group with limits or calls: its limits, where they come from, and what it
        runs and holds queued on this node."""
        tally = self.limits.tally()
        groups = sorted({*self.configured, *self.stored, *tally})
        out: list[dict[str, object]] = []
        for group in groups:
            if group.startswith("tool:"):
                continue
            limit = self.stored.get(group, self.configured.get(group))
            source = "api" if group in self.stored else "config" if limit is not None else None
            running, waiting = tally.get(group, (0, 0))
            out.append(
                {
                    "group": group,
                    "limit": limit.model_dump() if limit is not None else None,
                    "source": source,
                    "running": running,
                    "lowered_to": self.limits.lowered(group),
                    "waiting": waiting,
                }
            )
        return out


DAY = 86_400.0


def day_of(at: float) -> str:
    """The UTC day of a Unix time, as a tenant's usage is counted: ``2026-12-08``. Its
    first seven characters are its month."""
    return time.strftime("%Y-%m-%d", time.gmtime(at))


class StoredBudget(msgspec.Struct, frozen=True):
    """A tenant's budget as stored, with who set it last (a removed budget stays as None,
    so that the other nodes learn who removed it)."""

    budget: TenantBudget | None
    by: str | None = None


class TenantBudgets:
    """The tenants' budgets, and what each tenant with one has used this UTC month, by day.

    A tenant's usage is added to by the commit of each model result of its sessions
    (``Committer``, ``Write.tenant_usage``), so storage counts every call once. A node
    knows what its own commits added (``counted``); in a cluster it reads the whole of it
    every ``FOLLOW`` seconds, so the others' calls reach its count within that.

    A turn whose tenant's budget is used up (``reached``) waits (``turn.hold_for_tenant``).
    ``check`` ends those waits when the budget allows again: raised, removed, or a new day
    or month; it runs every ``FOLLOW`` seconds and at once after a change on this node.
    """

    def __init__(self, store: Store, now: Callable[[], float], cluster: bool = False) -> None:
        self.store = store
        self.now = now
        self.cluster = cluster
        """Other nodes add to the tenants' usage: read it every ``FOLLOW`` seconds."""
        self.budgets: dict[str, TenantBudget] = {}
        self.days: dict[str, dict[str, Usage]] = {}
        """What each tenant with a budget used, by day, this month."""
        self.held: set[str] = set()
        """Tenants whose budget may hold turns waiting: ``check`` looks at them."""
        self.resume: Callable[[str, str | None], Awaitable[None]] | None = None
        """Ends the waits on a tenant's budget where it allows them to go on, saying who
        changed it (``Sessions.recheck_budgets``)."""
        self._verdicts: dict[str, tuple[str, str | None]] = {}
        """Each tenant's last ``reached`` reason (None: not reached), with the day it holds
        for: dropped when its usage or budget changes."""
        self._day: tuple[float, float, str] = (0.0, 0.0, "")
        """The UTC day last asked for: (its start, its end, its name)."""

    def day(self, now: float) -> str:
        """``day_of(now)``, cheaply: the day last asked for, while ``now`` is in it."""
        start, end, name = self._day
        if not start <= now < end:
            name = day_of(now)
            start = float(calendar.timegm(time.strptime(name, "%Y-%m-%d")))
            self._day = (start, start + DAY, name)
        return name

    def reached(self, tenant: str, now: float) -> tuple[str, TenantBudget] | None:
        """Why a model call of ``tenant``'s may not start now (in words), with its budget;
        None if it may (as for a tenant with no budget)."""
        budget = self.budgets.get(tenant)
        if budget is None:
            return None
        day = self.day(now)
        verdict = self._verdicts.get(tenant)
        if verdict is None or verdict[0] != day:
            verdict = (day, budget.reached(tenant, *self.used(tenant, day)))
            self._verdicts[tenant] = verdict
        reason = verdict[1]
        if reason is None:
            return None
        self.held.add(tenant)
        return reason, budget

    def used(self, tenant: str, day: str) -> tuple[Usage, Usage]:
        """What ``tenant`` used on ``day`` and in its month, as this node knows it."""
        days = self.days.get(tenant, {})
        month = Usage()
        for d, u in days.items():
            if d[:7] == day[:7]:
                month += u
        return days.get(day) or Usage(), month

    def counted(self, usage: TenantUsage) -> None:
        """A model call of the tenant's committed on this node."""
        days = self.days.get(usage.tenant)
        if days is None:
            return  # no budget: storage counts it, this node need not
        day = days.setdefault(usage.day, Usage())
        day.add(usage.input_tokens, usage.output_tokens, usage.cost_usd)
        self._verdicts.pop(usage.tenant, None)

    async def load(self) -> dict[str, str | None]:
        """Read the budgets, and what the tenants with one used this month. Returns the
        tenants whose budget changed since the last read, each with who changed it."""
        rows = await self.store.load_tenant_budgets()
        stored = {t: msgspec.json.decode(spec, type=StoredBudget) for t, spec in rows}
        budgets = {t: s.budget for t, s in stored.items() if s.budget is not None}
        changed = {t for t in {*budgets, *self.budgets} if budgets.get(t) != self.budgets.get(t)}
        self.held |= changed  # raised or removed elsewhere: its waits may go on
        self.budgets = budgets
        await self._read_usage(list(budgets))
        return {t: stored[t].by if t in stored else None for t in changed}

    async def _read_usage(self, tenants: list[str]) -> None:
        month = day_of(self.now())[:7]
        days: dict[str, dict[str, Usage]] = {t: {} for t in tenants}
        for u in await self.store.tenant_usage(month + "-01", tenants):
            days[u.tenant][u.day] = _usage(u)
        for tenant in [t for t in self.days if t not in self.budgets]:
            del self.days[tenant]
        self.days.update(days)
        self._verdicts.clear()

    async def follow(self) -> None:
        """Every ``FOLLOW`` seconds, until cancelled: in a cluster, read the budgets and
        usage again; then end the waits that may go on (``check``)."""
        while True:
            await asyncio.sleep(FOLLOW)
            try:
                await self.check(await self.load() if self.cluster else None)
            except Exception as e:  # storage away for a moment: next time
                log.warning(
                    "could not check the tenants' budgets: %r",
                    e,
                    extra={"action": "tenant_budgets.check"},
                )

    async def check(self, by: dict[str, str | None] | None = None) -> None:
        """For each tenant whose budget may hold turns and allows them now (raised,
        removed, a new day or month): end the waits on it (``by``: who changed which
        tenant's budget)."""
        now = self.now()
        month = day_of(now)[:7]
        for days in self.days.values():
            for day in [d for d in days if d[:7] != month]:
                del days[day]
        for tenant in sorted(self.held):
            if tenant in self.budgets and self.reached(tenant, now) is not None:
                continue
            self.held.discard(tenant)
            if self.resume is not None:
                await self.resume(tenant, (by or {}).get(tenant))

    async def set(self, tenant: str, budget: TenantBudget | None, by: str | None = None) -> None:
        """Store ``tenant``'s budget (None: no budget) and apply it on this node at once:
        waits it allows end now (``by``: who changed it), on other nodes within
        ``FOLLOW`` seconds."""
        spec = msgspec.json.encode(StoredBudget(budget, by)).decode()
        await self.store.write(Write(tenant_budgets=[(tenant, spec)]))
        self._verdicts.pop(tenant, None)
        if budget is None:
            self.budgets.pop(tenant, None)
            self.days.pop(tenant, None)
        else:
            self.budgets[tenant] = budget
            await self._read_usage([tenant])
        self.held.add(tenant)
        await self.check({tenant: by})

    async def view(self, tenant: str | None = None) -> list[dict[str, object]]:
        """Each tenant with a budget or usage this month (``tenant``: that one, even with
        neither): its budget and what it used today and this month, as storage counts it."""
        day = day_of(self.now())
        rows = await self.store.tenant_usage(day[:7] + "-01", None if tenant is None else [tenant])
        found: dict[str, dict[str, Usage]] = {}
        for u in rows:
            found.setdefault(u.tenant, {})[u.day] = _usage(u)
        names = [tenant] if tenant is not None else sorted({*found, *self.budgets})
        out: list[dict[str, object]] = []
        for name in names:
            days = found.get(name, {})
            month = Usage()
            for used in days.values():
                month += used
            budget = self.budgets.get(name)
            today = days.get(day) or Usage()
            out.append(
                {
                    "tenant": name,
                    "budget": msgspec.to_builtins(budget) if budget is not None else None,
                    "day": day,
                    "today": usage_view(today),
                    "this_month": usage_view(month),
                    "reached": budget.reached(name, today, month) if budget else None,
                }
            )
        return out


def _usage(row: TenantUsage) -> Usage:
    return Usage(
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cost_usd=row.cost_usd,
        calls=row.calls,
    )


def usage_view(used: Usage) -> dict[str, object]:
    return {
        "input_tokens": used.input_tokens,
        "output_tokens": used.output_tokens,
        "tokens": used.tokens,
        "cost_usd": used.cost_usd,
        "calls": used.calls,
    }

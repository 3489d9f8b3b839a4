"""Flow control's domain: the model limits a node enforces (``dex.server.dispatch.limits``),
from its server config and from storage.

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
import logging
from collections.abc import Callable, Mapping

from dex.server.dispatch.limits import Limit as Limit
from dex.server.dispatch.limits import Limits
from dex.server.store.base import Store, Write

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
        waiting = self.limits.waiting()
        own = {g: self.limits.running(g) + waiting.get(g, 0) for g in self.limits.configured}
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
        waiting = self.limits.waiting()
        groups = sorted({*self.configured, *self.stored, *self.limits.groups()})
        out: list[dict[str, object]] = []
        for group in groups:
            if group.startswith("tool:"):
                continue
            limit = self.stored.get(group, self.configured.get(group))
            source = "api" if group in self.stored else "config" if limit is not None else None
            out.append(
                {
                    "group": group,
                    "limit": limit.model_dump() if limit is not None else None,
                    "source": source,
                    "running": self.limits.running(group),
                    "lowered_to": self.limits.lowered(group),
                    "waiting": waiting.get(group, 0),
                }
            )
        return out

"""Flow control's domain: the model limits a node enforces (``dex.server.dispatch.limits``),
from its server config and from storage.

A limit set at run time (the API, ``dex limits set``) is stored, and replaces the server
config's limit of that group; cleared, the config's applies again. Every node of a
cluster reads the stored limits every ``FOLLOW`` seconds, so a change made on one reaches
all within that; the node that made it applies it at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from dex.server.dispatch.limits import Limit as Limit
from dex.server.dispatch.limits import Limits
from dex.server.store.base import Store, Write

log = logging.getLogger("dex.flow")

FOLLOW = 2.0
"""Seconds between two reads of the stored limits by each node of a cluster."""


class ModelLimits:
    def __init__(self, store: Store, limits: Limits, configured: Mapping[str, Limit]) -> None:
        self.store = store
        self.limits = limits
        self.configured = dict(configured)
        """The server config's limits, by group."""
        self.stored: dict[str, Limit] = {}
        """The limits set at run time, by group."""

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
            except Exception as e:  # storage away for a moment: read them next time
                log.warning("could not read the limits: %r", e, extra={"action": "limits.read"})

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

"""Leadership: whether a node may serve, and for how long it may trust that it still does.

A node serves (dispatches Steps, fires timers, answers the API) only while it holds its
lease. ``Leadership`` is what the node needs of a lease; the PostgreSQL ``Lease``
(``dex.server.ha.lease``) provides it for the nodes of a cluster, which share the
partitions out, and ``Solo`` for the embedded SQLite node, which leads from the start
(the lock on its data directory keeps any other node out).
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Leadership(Protocol):
    lost: asyncio.Event
    """Set when this node may have lost the lead (its lock connection died, a ping failed,
    a write was fenced): it must stop serving at once."""

    async def acquire(self) -> int:
        """Wait until this node leads alone; return its epoch (a cluster node's
        ``Lease`` joins instead: ``Lease.join``)."""
        ...

    async def release(self) -> None:
        """Give the lead up at once (a planned stop), so a standby takes it without
        waiting for a timeout."""
        ...

    def valid(self) -> bool:
        """Whether the lead is surely still held now. Answers given from memory (a
        heartbeat reply, a start acknowledgement) are given only while it is."""
        ...


class Solo:
    """The embedded node's leadership: it leads from the start, with epoch 1, and never
    loses the lead."""

    def __init__(self) -> None:
        self.lost = asyncio.Event()

    async def acquire(self) -> int:
        return 1

    async def release(self) -> None:
        return None

    def valid(self) -> bool:
        return True

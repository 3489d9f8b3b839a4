"""The ready Steps of one queue, served fairly between tenants.

Each tenant (sessions without one share the lane ``""``) has a lane of its ready Steps,
the session's priority first and then in order. The lanes take turns by start-time fair
queueing: a tenant that becomes active starts at the queue's virtual time, and each Step
it is served moves its next turn on by ``1 / weight``; the tenant whose turn comes first
is served next. A tenant with a thousand Steps queued therefore delays another's first
Step by at most one hand-out, and over time each active tenant gets its weight's share.
With no tenants, one lane: first come, first served, as before.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import NamedTuple

from dex.server.dispatch.limits import Ask


class Queued(NamedTuple):
    """A queued Step, as the dispatcher holds it."""

    session_id: str
    step_id: str
    queue: str
    ask: Ask | None = None
    """What its hand-out asks of the limits."""
    tenant: str = ""
    priority: int = 0
    """Its session's: a higher one goes first among its tenant's Steps."""


FIRST = 1 << 62
"""The priority of a Step put back at the front of its lane (``push(..., front=True)``)."""


class FairQueue:
    def __init__(self, weight: Callable[[str], float]) -> None:
        self.weight = weight
        """A tenant's weight (its share of the hand-outs while others wait too)."""
        self._lanes: dict[str, list[tuple[int, int, Queued]]] = {}
        """Each active tenant's Steps: (minus priority, order, Step), a heap."""
        self._turns: list[tuple[float, int, str]] = []
        """(virtual time of its next turn, order, tenant) of each active tenant."""
        self._next: dict[str, float] = {}
        self._now = 0.0
        self._order = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, step: Queued, front: bool = False) -> None:
        """Queue ``step``; with ``front``, ahead of its tenant's other Steps (it waited)."""
        lane = self._lanes.get(step.tenant)
        if lane is None:
            lane = self._lanes[step.tenant] = []
            turn = max(self._now, self._next.get(step.tenant, self._now))
            self._next[step.tenant] = turn
            heapq.heappush(self._turns, (turn, next(self._order), step.tenant))
        priority = FIRST if front else step.priority
        heapq.heappush(lane, (-priority, next(self._order), step))
        self._size += 1

    def pop(self) -> Queued:
        """The Step of the tenant whose turn comes first."""
        turn, _, tenant = heapq.heappop(self._turns)
        lane = self._lanes[tenant]
        _, _, step = heapq.heappop(lane)
        self._size -= 1
        self._now = turn
        after = turn + 1 / max(self.weight(tenant), 1e-9)
        if lane:
            self._next[tenant] = after
            heapq.heappush(self._turns, (after, next(self._order), tenant))
        else:  # idle: it starts again at the virtual time when it comes back
            del self._lanes[tenant]
            del self._next[tenant]
        return step

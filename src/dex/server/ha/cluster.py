"""A node's place in a cluster: which partitions it owns, which it should own, and which
node serves a session.

Nodes share the partitions out among themselves with no coordinator: at each ping every
node reads the same ``View`` (live nodes and who owns what, from PostgreSQL's locks) and
works out its own share (``plan``): the non-standby nodes, sorted by id, each get
``count // n`` partitions, and the first ``count % n`` one more. A node under its share
takes free partitions (a dead node's locks are free at once), a node over it gives its
surplus back after draining it, so the shares even out within one partition. A standby
owns nothing while a non-standby node lives; when none does, the standby that holds the
standby's lock takes every partition (today's hot standby).

A partition this node owns is ``recovering`` (taken, its sessions not yet recovered),
``serving``, or ``draining`` (given up: nothing new is handed out, its running attempts
finish, then its lock is freed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dex.errors import Unavailable
from dex.server.store.partitions import partition_of


@dataclass(frozen=True)
class Member:
    """A live node, as the cluster's view shows it."""

    node_id: str
    address: str
    """The base URL other nodes, clients and Workers reach it at."""
    standby: bool
    partitions: tuple[int, ...]
    """The partitions it owns now."""
    here: bool = False
    """Whether it is the node that reads this view."""


@dataclass(frozen=True)
class View:
    """The cluster at one ping, read from ``pg_locks``: live nodes (those holding their node
    lock), who owns each partition, and which standby holds the standby's lock."""

    members: dict[str, Member]
    owners: dict[int, str]
    """Partition -> the live node that holds its lock; a partition not here is free."""
    leader: str | None
    """The standby that stands in when no other node serves (holds ``LEADER_KEY``)."""


@dataclass(frozen=True)
class Plan:
    take: list[int]
    give: list[int]
    lead: bool = False
    """A standby that should try the standby's lock (nobody holds it, nobody else serves)."""


def share(count: int, nodes: list[str], node: str) -> int:
    """How many of ``count`` partitions ``node`` should own among ``nodes`` (its place
    in their sorted order decides who gets the remainder)."""
    ordered = sorted(nodes)
    if node not in ordered:
        return 0
    n = len(ordered)
    return count // n + (1 if ordered.index(node) < count % n else 0)


def plan(
    view: View,
    me: str,
    standby: bool,
    count: int,
    owned: Iterable[int],
    pending: Iterable[int] = (),
) -> Plan:
    """What this node should do now: the free partitions to take (``pending`` are being
    taken already) and the owned ones to give up (``owned`` excludes those draining)."""
    owned, pending = set(owned), set(pending)
    active = [m.node_id for m in view.members.values() if not m.standby]
    if not standby:
        target = share(count, active, me)
    elif active:
        target = 0
    elif view.leader == me:
        target = count
    else:
        return Plan([], [], lead=view.leader is None)
    if len(owned) > target:
        return Plan([], sorted(owned)[target:])
    wanted = target - len(owned) - len(pending)
    if wanted <= 0:
        return Plan([], [])
    free = [p for p in range(count) if p not in view.owners and p not in pending]
    return Plan(free[:wanted], [])


class Cluster:
    """The loop side's bookkeeping of a node in a cluster (``Node`` acts on it): its
    partitions' states, the latest view, and routing."""

    def __init__(self, node_id: str, partition_count: int, standby: bool) -> None:
        self.node_id = node_id
        self.partition_count = partition_count
        self.standby = standby
        self.view = View({}, {}, None)
        self.epochs: dict[int, int] = {}
        """Every partition this node holds, with the epoch it took it with."""
        self.serving: set[int] = set()
        self.recovering: set[int] = set()
        self.draining: set[int] = set()
        self.taking: set[int] = set()
        """Asked of the lock thread, not answered yet."""

    def partition(self, session_id: str) -> int:
        return partition_of(session_id, self.partition_count)

    def next_plan(self) -> Plan:
        owned = self.serving | self.recovering
        return plan(self.view, self.node_id, self.standby, self.partition_count, owned, self.taking)

    def dispatches(self, session_id: str) -> bool:
        """Whether this node hands out the session's Steps and fires its timers (it owns
        the partition, and is not giving it up)."""
        p = partition_of(session_id, self.partition_count)
        return p in self.serving or p in self.recovering

    def recovered(self, session_id: str) -> bool:
        """Whether this node owns the session's partition and has recovered it: it holds
        every attempt of the session that runs (``Attempts.recovered``)."""
        return partition_of(session_id, self.partition_count) in self.serving

    def serves(self, session_id: str) -> bool:
        """Whether this node answers for the session (client calls, new ids)."""
        p = partition_of(session_id, self.partition_count)
        return p in self.serving or p in self.draining

    def owns_any(self) -> bool:
        return bool(self.serving)

    def route(self, session_id: str) -> str | None:
        """None: serve the session here; else the base URL of the node that owns its
        partition. ``Unavailable`` when no live node serves it now (a takeover, a
        recovery)."""
        p = partition_of(session_id, self.partition_count)
        if p in self.serving or p in self.draining:
            return None
        owner = self.view.owners.get(p)
        if owner is not None and owner != self.node_id:
            member = self.view.members.get(owner)
            if member is not None and member.address:
                return member.address
        raise Unavailable(
            f"no node serves session {session_id!r} now (partition {p} is being taken "
            "over): try again in a moment",
            session_id=session_id,
        )

    def members(self) -> list[Member]:
        """The live nodes, this one first."""
        members = sorted(self.view.members.values(), key=lambda m: m.node_id != self.node_id)
        return members

    def worker_addresses(self) -> list[str]:
        """Where a Worker should be connected: every node that serves, or may (not a
        standby that owns nothing)."""
        return sorted(
            m.address
            for m in self.view.members.values()
            if m.address and (not m.standby or m.partitions)
        )

"""The narrow interface between the domain and storage.

The domain hands the store plain data (a ``Write`` per transition: ids, statuses and
JSON text it encoded itself) and reads JSON text back; the store never sees a domain
type, and the domain never sees SQL. A backend commits many ``Write`` objects in one
durable transaction (group commit) but each one succeeds or fails alone.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import NamedTuple


class SessionRecord(NamedTuple):
    """A session's state as JSON, with the columns the store indexes.

    This and the other records a transition writes (``Row``, ``TurnRecord``) are named
    tuples: immutable as a frozen dataclass, and a third of its cost to make (every
    commit makes them; measured with callgrind, about 6,000 instructions for this one
    against 16,500)."""

    id: str
    agent: str
    created_at: float
    status: str
    """``idle``, ``running``, ``waiting`` or ``failed``: a session is in a turn (one a
    starting node recovers) when it is ``running`` or ``waiting``."""
    state: str
    turn: int | None = None
    """The current turn's number: ``load_session`` reads that turn's Step and call rows."""
    updated_at: float | None = None
    """When this write happens (None: ``created_at``)."""
    waiting_since: float | None = None
    """Since when the session waits for a person; None when it does not."""
    outcome_unknown: int = 0
    """How many of its tool calls have an unknown outcome nobody has settled."""
    tenant: str | None = None
    """Whose session it is: written when it is created, never changed."""
    usage: tuple[int, int, float] = (0, 0, 0.0)
    """What its model calls used: input tokens, output tokens, cost in US dollars."""


class Row(NamedTuple):
    """A Step or a tool call of a turn, as JSON: the ``seq``-th of its kind in the turn."""

    turn: int
    seq: int
    json: str


class TurnRecord(NamedTuple):
    number: int
    status: str
    turn: str
    """The turn as JSON."""


class TenantUsage(NamedTuple):
    """What a tenant's model calls used in one UTC day (``2026-12-08``)."""

    tenant: str
    day: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    calls: int = 1


class RememberedMessage(NamedTuple):
    """A client message id remembered for idempotent sends, and what its send did."""

    message_id: str
    number: int
    """The turn that answers the message (for a steered one, the turn it joined)."""
    outcome: str | None = None
    """started, queued, interrupted or steered; None if remembered before outcomes were."""
    interrupted: int | None = None
    """For an interrupting message: the turn it cancelled."""


@dataclass
class Write:
    """Everything one transition writes. Applied all or nothing."""

    session: SessionRecord | None = None
    create: bool = False
    """Insert ``session`` as new; a session with that id already existing is a ``Conflict``."""
    history: list[str] = field(default_factory=list)
    """History items as JSON."""
    history_start: int = 0
    """The sequence number of ``history[0]``."""
    steps: list[Row] = field(default_factory=list)
    """Steps to insert or replace."""
    calls: list[Row] = field(default_factory=list)
    """Tool calls to insert or replace (of the current turn, or of an archived one)."""
    ended_turn: TurnRecord | None = None
    archived_turns: list[TurnRecord] = field(default_factory=list)
    """Ended turns to insert with a new session (a fork's copies of the original's; their
    Steps and calls are in ``steps`` and ``calls``)."""
    message: RememberedMessage | None = None
    """A client message id to remember for idempotent sends."""
    agents: list[tuple[str, str]] = field(default_factory=list)
    """(name, spec as JSON) to insert or replace."""
    limits: list[tuple[str, str | None]] = field(default_factory=list)
    """(model group, its limits as JSON) to insert or replace; with None, to delete."""
    tenant_budgets: list[tuple[str, str | None]] = field(default_factory=list)
    """(tenant, its budget as JSON) to insert or replace; with None, to delete."""
    tenant_usage: TenantUsage | None = None
    """What a model call whose result this write commits used, to add to its tenant's day."""

    def size(self) -> int:
        """Characters of JSON this write stores: what a transition costs the disk."""
        n = 0 if self.session is None else len(self.session.state)
        if self.history:  # each sum costs, empty or not: most writes have few of these
            n += sum(map(len, self.history))
        if self.steps:
            n += sum(len(r.json) for r in self.steps)
        if self.calls:
            n += sum(len(r.json) for r in self.calls)
        if self.ended_turn is not None:
            n += len(self.ended_turn.turn)
        return n


@dataclass(frozen=True, slots=True)
class StoredSession:
    """What ``load_session`` reads: the state, its current turn's rows, the history."""

    state: str
    steps: list[str]
    calls: list[str]
    history: list[str]
    """Oldest first."""


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """An archived turn: its record and its Step and call rows, in order."""

    turn: str
    steps: list[str]
    calls: list[str]


class Said(NamedTuple):
    """A session's last message: who said it (``user`` or ``assistant``), and its text
    (its first ``SAID_CHARS`` characters)."""

    role: str
    text: str


SAID_CHARS = 300


@dataclass
class SessionRow:
    id: str
    agent: str
    created_at: float
    status: str
    updated_at: float
    waiting_since: float | None
    outcome_unknown: int
    tenant: str | None
    usage: dict[str, float] | None = None
    """The tokens and cost of its model calls (``input_tokens``, ``output_tokens``,
    ``cost_usd``): the columns each transition writes (``SessionRecord.usage``)."""


@dataclass
class ListedSession(SessionRow):
    """A row of the list read with ``SessionQuery(last_message=True)``."""

    last_message: Said | None = None
    """The latest user message or assistant text of its history; None before any."""


IN_A_TURN = ("running", "waiting")
"""The statuses of a session in a turn."""


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """Which sessions to list, newest first by ``order``, one page at a time."""

    limit: int
    order: str = "created"
    """``created`` or ``updated``: the time the list is ordered by, newest first."""
    before: tuple[float, str] | None = None
    """Keyset: only sessions strictly after this (time, id) in the order (the last row of
    the previous page)."""
    agent: str | None = None
    status: str | None = None
    tenant: str | None = None
    """Only this tenant's sessions."""
    outcome_unknown: bool = False
    """Only sessions with an ``outcome_unknown`` tool call."""
    created: tuple[float | None, float | None] = (None, None)
    """``[since, before)`` on ``created_at``; None leaves a side open."""
    updated: tuple[float | None, float | None] = (None, None)
    last_message: bool = False
    """Read each session's last message too (``ListedSession``): one look at the end of
    its history, by the history's primary key, in the same read."""


@dataclass(frozen=True, slots=True)
class StoreCounters:
    """What a store has done since it was made, as the node's metrics show it
    (``dex_store_*`` on ``/metrics``)."""

    commits: int = 0
    """Transactions committed: over ``operations``, how well commits group."""
    operations: int = 0
    """Operations (writes and reads) run."""
    busy_seconds: float = 0.0
    """Wall time the one writer spent committing batches: over elapsed time, how busy it is
    (it commits in series, so at 1.0 it sets the node's pace)."""
    commit_failures: int = 0
    """Batches whose commit failed (a full disk, an I/O error): nothing of them written."""
    bytes_written: int = 0
    """Characters of JSON committed (session states, history items, Steps, turns)."""


def migrations(dialect: str) -> list[tuple[int, str]]:
    """The numbered schema migrations of one dialect (``sqlite``, ``postgresql``), in order."""
    folder = resources.files("dex.server.store") / "migrations" / dialect
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


class Store(ABC):
    fence: dict[int, int] | None = None
    """The partitions this node owns, with the epoch it took each with: a backend shared
    by several nodes refuses a write to a partition not in it (``Unavailable``: another
    node serves it) and every batch to one another node has taken since (``Fenced``).
    None: a node alone on its store (SQLite), which checks nothing."""
    partition_count = 1
    """How many partitions the store's sessions are shared out in
    (``dex.server.store.partitions``): 1 on a store only one node uses."""
    on_lost: Callable[[], None] | None = None
    """Called once if the store can no longer write while open (SQLite: its writer
    process died). It then refuses every call; ``dex server`` exits, and its restart
    recovers from what was committed."""

    @abstractmethod
    async def open(self) -> None:
        """Connect and run pending migrations."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def submit(self, write: Write) -> asyncio.Future[None]:
        """Queue ``write`` for the next group commit and return at once: the future
        resolves once it is durable, or fails as ``write`` would."""

    async def write(self, write: Write) -> None:
        """Commit durably. Raises ``Conflict`` or ``StorageError``; then nothing was written,
        except ``CommitUnknown``: the outcome is unknown."""
        await self.submit(write)

    @abstractmethod
    async def load_session(self, session_id: str) -> StoredSession | None: ...

    @abstractmethod
    async def list_sessions(self, query: SessionQuery) -> list[SessionRow]:
        """One page of the sessions ``query`` selects, newest first by its order (ties by
        id, in byte order on every backend), at a cost that does not grow with the
        sessions stored: an index gives each filter alone in its order. With
        ``query.last_message``, each row is a ``ListedSession``."""

    @abstractmethod
    async def waiting_sessions(
        self, limit: int, before: tuple[float, str] | None, tenant: str | None = None
    ) -> list[tuple[str, float]]:
        """(id, waiting_since) of sessions that wait for a person, the latest to start
        waiting first, strictly after ``before`` in that order (``tenant``: only that
        tenant's)."""

    @abstractmethod
    async def running_sessions(self) -> list[str]:
        """Ids of sessions in a turn: the ones a starting node must recover."""

    @abstractmethod
    async def load_turn(self, session_id: str, number: int) -> StoredTurn | None: ...

    @abstractmethod
    async def load_turns(self, session_id: str) -> list[StoredTurn]:
        """Every ended turn of the session, oldest first."""

    @abstractmethod
    async def find_message(self, session_id: str, message_id: str) -> RememberedMessage | None: ...

    @abstractmethod
    async def load_limits(self) -> list[tuple[str, str]]:
        """The model limits set at run time: (group, limits as JSON)."""

    async def exchange_demand(
        self, node: str, demand: dict[str, int], at: float, since: float
    ) -> list[tuple[str, str, int]] | None:
        """In a cluster: store this node's demand on each limited model group (at ``at``)
        and read the other nodes' reported since ``since``: (node, group, demand). None:
        no cluster shares this store."""
        return None

    @abstractmethod
    async def load_tenant_budgets(self) -> list[tuple[str, str]]:
        """The tenants' budgets: (tenant, budget as JSON)."""

    @abstractmethod
    async def tenant_usage(
        self, since_day: str, tenants: list[str] | None = None
    ) -> list[TenantUsage]:
        """What the tenants used each day from ``since_day`` on (``tenants``: only theirs),
        by tenant then day."""

    @abstractmethod
    async def load_agents(self) -> list[str]:
        """Every agent spec as JSON, ordered by name."""

    @abstractmethod
    async def schema_version(self) -> int: ...

    @abstractmethod
    def counters(self) -> StoreCounters:
        """What this store has done so far; cheap, read at each scrape of the metrics."""

"""The narrow interface between the domain and storage.

The domain hands the store plain data (a ``Write`` per transition: ids, statuses and
JSON text it encoded itself) and reads JSON text back; the store never sees a domain
type, and the domain never sees SQL. A backend commits many ``Write`` objects in one
durable transaction (group commit) but each one succeeds or fails alone.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import resources


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's state as JSON, with the columns the store indexes."""

    id: str
    agent: str
    created_at: float
    status: str
    state: str
    turn: int | None = None
    """The current turn's number: ``load_session`` reads that turn's Step and call rows."""


@dataclass(frozen=True, slots=True)
class Row:
    """A Step or a tool call of a turn, as JSON: the ``seq``-th of its kind in the turn."""

    turn: int
    seq: int
    json: str


@dataclass(frozen=True, slots=True)
class TurnRecord:
    number: int
    status: str
    turn: str
    """The turn as JSON."""


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
    message: tuple[str, int] | None = None
    """(client message id, message number) to remember for idempotent sends."""
    agents: list[tuple[str, str]] = field(default_factory=list)
    """(name, spec as JSON) to insert or replace."""

    def size(self) -> int:
        """Characters of JSON this write stores: what a transition costs the disk."""
        n = sum(map(len, self.history))
        n += sum(len(r.json) for r in self.steps) + sum(len(r.json) for r in self.calls)
        if self.session is not None:
            n += len(self.session.state)
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


@dataclass
class SessionRow:
    id: str
    agent: str
    created_at: float
    status: str


def migrations(dialect: str) -> list[tuple[int, str]]:
    """The numbered schema migrations of one dialect (``sqlite``, ``postgresql``), in order."""
    folder = resources.files("dex.server.store") / "migrations" / dialect
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


class Store(ABC):
    fence_epoch: int | None = None
    """The epoch of the lead this node holds: a backend shared by several nodes refuses
    every write once another node has taken the lead with a higher epoch."""

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
    async def list_sessions(self, limit: int, after: str | None) -> list[SessionRow]:
        """Sessions ordered by id (byte order on every backend), after ``after``."""

    @abstractmethod
    async def running_sessions(self) -> list[str]:
        """Ids of sessions in a turn: the ones a starting node must recover."""

    @abstractmethod
    async def load_turn(self, session_id: str, number: int) -> StoredTurn | None: ...

    @abstractmethod
    async def load_turns(self, session_id: str) -> list[StoredTurn]:
        """Every ended turn of the session, oldest first."""

    @abstractmethod
    async def find_message(self, session_id: str, message_id: str) -> int | None: ...

    @abstractmethod
    async def load_agents(self) -> list[str]:
        """Every agent spec as JSON, ordered by name."""

    @abstractmethod
    async def schema_version(self) -> int: ...

    @staticmethod
    def from_url(url: str) -> Store:
        """A store for ``sqlite:///path`` or ``postgresql://…`` (unopened)."""
        from dex.server.store.open import open_store

        return open_store(url)

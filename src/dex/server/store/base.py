"""The narrow interface between the domain and storage.

The domain hands the store plain data (a ``Write`` per transition) and reads
plain data back; it never sees SQL. A backend commits many ``Write`` objects in
one durable transaction (group commit) but each one succeeds or fails alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import resources

from dex.server.engine.state import SessionState, Turn
from dex.wire import AgentSpec, Item


@dataclass
class Write:
    """Everything one transition writes. Applied all or nothing."""

    session: SessionState | None = None
    create: bool = False
    """Insert ``session`` as new; a session with that id already existing is a ``Conflict``."""
    history: list[Item] = field(default_factory=list)
    history_start: int = 0
    """The sequence number of ``history[0]``."""
    ended_turn: Turn | None = None
    updated_turn: Turn | None = None
    """An archived turn whose record changed (a reconciled tool call)."""
    message: tuple[str, int] | None = None
    """(client message id, message number) to remember for idempotent sends."""
    agents: list[AgentSpec] = field(default_factory=list)


@dataclass
class SessionRow:
    id: str
    agent: str
    created_at: float
    status: str


def migrations() -> list[tuple[int, str]]:
    """The numbered schema migrations, in order."""
    folder = resources.files("dex.server.store") / "migrations"
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
    async def write(self, write: Write) -> None:
        """Commit durably. Raises ``Conflict`` or ``StorageError``; then nothing was written."""

    @abstractmethod
    async def load_session(self, session_id: str) -> tuple[SessionState, list[Item]] | None: ...

    @abstractmethod
    async def list_sessions(self, limit: int, after: str | None) -> list[SessionRow]: ...

    @abstractmethod
    async def running_sessions(self) -> list[str]:
        """Ids of sessions in a turn: the ones a starting node must recover."""

    @abstractmethod
    async def load_turn(self, session_id: str, number: int) -> Turn | None: ...

    @abstractmethod
    async def load_turns(self, session_id: str) -> list[Turn]:
        """Every ended turn of the session, oldest first."""

    @abstractmethod
    async def find_message(self, session_id: str, message_id: str) -> int | None: ...

    @abstractmethod
    async def load_agents(self) -> list[AgentSpec]: ...

    @abstractmethod
    async def schema_version(self) -> int: ...

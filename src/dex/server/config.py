"""Server configuration: one frozen value with named defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 7450


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path = Path("dex-data")
    database: str | None = None
    """``sqlite:///path`` or ``postgresql://…`` (``DEX_DATABASE``); None: SQLite in ``data_dir``."""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    heartbeat_timeout: float = 10.0
    """Seconds without a heartbeat after which an attempt fails (``DEX_HEARTBEAT_TIMEOUT``)."""
    reconnect_grace: float = 1.0
    """Seconds a closed Worker connection's attempts wait for the Worker to reconnect and
    re-claim them before they fail (``DEX_RECONNECT_GRACE``)."""
    drain_timeout: float = 20.0
    """On SIGTERM, how long running attempts may take to finish before they fail
    (``DEX_SERVER_DRAIN_TIMEOUT``)."""
    max_body_bytes: int = 1 << 20
    """Requests with a larger body are refused with 413 (``DEX_MAX_BODY_BYTES``)."""
    max_wait_seconds: float = 60.0
    """The longest a request may wait for a turn to end."""
    client_token: str | None = None
    """With any token set, auth is on: clients send this one (``DEX_CLIENT_TOKEN``)."""
    worker_token: str | None = None
    """What Workers send (``DEX_WORKER_TOKEN``)."""
    admin_token: str | None = None
    """Opens everything, ``/metrics`` included (``DEX_ADMIN_TOKEN``)."""

    @property
    def database_path(self) -> Path:
        return self.data_dir / "dex.sqlite3"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.database_path}"

"""A Worker's settings."""

from __future__ import annotations

from pydantic import Field

from dex._settings import Settings


class WorkerConfig(Settings):
    """A Worker's settings. ``dex worker`` fills them from its flags, the ``DEX_*``
    variables and ``--config dex.toml`` (the ``[worker]`` table), in that order."""

    table = "worker"

    address: str | None = Field(None, validation_alias="DEX_ADDRESS")
    """The server's address(es), comma-separated (``DEX_ADDRESS``), when the Worker is
    given none."""
    capacity: int = Field(16, ge=1, le=100_000, validation_alias="DEX_WORKER_CAPACITY")
    """How many attempts this Worker runs at once (``DEX_WORKER_CAPACITY``)."""
    heartbeat_interval: float = Field(1.0, gt=0, validation_alias="DEX_WORKER_HEARTBEAT_INTERVAL")
    drain_timeout: float = Field(30.0, ge=0, validation_alias="DEX_DRAIN_TIMEOUT")
    """On shutdown, how long running attempts may take to finish (``DEX_DRAIN_TIMEOUT``)."""
    reconnect_initial: float = Field(0.1, gt=0, validation_alias="DEX_WORKER_RECONNECT_INITIAL")
    """The first wait before reconnecting; it doubles (with jitter) up to ``reconnect_max``."""
    reconnect_max: float = Field(1.0, gt=0, validation_alias="DEX_WORKER_RECONNECT_MAX")
    """The longest wait between two tries to reach a server: a node that restarts (or a
    standby that takes over) gets this Worker back within about this long of serving."""
    connect_timeout: float = Field(3.0, gt=0, validation_alias="DEX_WORKER_CONNECT_TIMEOUT")
    """How long a connection's WebSocket upgrade may take before the next address is tried."""
    ping_interval: float = Field(2.0, gt=0, validation_alias="DEX_WORKER_PING_INTERVAL")
    """WebSocket pings: a node that stops answering them (hung, cut off) is left for the
    next address after half this long without a pong."""
    worker_id: str | None = Field(None, max_length=200, validation_alias="DEX_WORKER_ID")
    token: str | None = Field(None, validation_alias="DEX_WORKER_TOKEN", repr=False)
    """The worker token, when the server has auth on (default: ``DEX_WORKER_TOKEN``)."""
    tracing: bool = Field(False, validation_alias="DEX_TRACING")
    """OpenTelemetry spans of the attempts it runs, under the server's (``DEX_TRACING``;
    needs ``dex-runtime[otel]``)."""

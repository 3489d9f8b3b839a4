"""Server configuration: one frozen settings object with named defaults.

``dex server`` fills it from its flags, the ``DEX_*`` variables and ``--config dex.toml``
(the ``[server]`` table), in that order of precedence (``dex._settings``); code builds
it directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dex._settings import Settings
from dex.server.dispatch.limits import Limit

DEFAULT_PORT = 7450


class ModelPrice(BaseModel):
    """A model's price: US dollars per million input and output tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)


class ServerConfig(Settings):
    table = "server"

    data_dir: Path = Field(Path("dex-data"), validation_alias="DEX_DATA_DIR")
    """Where SQLite keeps state (``DEX_DATA_DIR``)."""
    database: str | None = Field(None, validation_alias="DEX_DATABASE")
    """``sqlite:///path`` or ``postgresql://…`` (``DEX_DATABASE``); None: SQLite in ``data_dir``."""
    listen: str = Field(f"127.0.0.1:{DEFAULT_PORT}", validation_alias="DEX_LISTEN")
    """``HOST:PORT`` to serve on (``DEX_LISTEN``)."""
    heartbeat_timeout: float = Field(10.0, gt=0, validation_alias="DEX_HEARTBEAT_TIMEOUT")
    """Seconds without a heartbeat after which an attempt fails (``DEX_HEARTBEAT_TIMEOUT``)."""
    reconnect_grace: float = Field(1.0, ge=0, validation_alias="DEX_RECONNECT_GRACE")
    """Seconds a closed Worker connection's attempts wait for the Worker to reconnect and
    re-claim them before they fail (``DEX_RECONNECT_GRACE``)."""
    reclaim_window: float = Field(3.0, ge=0, validation_alias="DEX_RECLAIM_WINDOW")
    """After a restart or a takeover, seconds an attempt that storage calls running waits
    for its Worker to reconnect and reclaim it, so that its result is kept, before it fails
    (``DEX_RECLAIM_WINDOW``; 0: it fails at once)."""
    drain_timeout: float = Field(20.0, ge=0, validation_alias="DEX_SERVER_DRAIN_TIMEOUT")
    """On SIGTERM, how long running attempts may take to finish before they fail
    (``DEX_SERVER_DRAIN_TIMEOUT``)."""
    max_body_bytes: int = Field(1 << 20, ge=1, validation_alias="DEX_MAX_BODY_BYTES")
    """Requests with a larger body are refused with 413 (``DEX_MAX_BODY_BYTES``)."""
    max_wait_seconds: float = Field(60.0, gt=0, validation_alias="DEX_MAX_WAIT_SECONDS")
    """The longest a request may wait for a turn to end (``DEX_MAX_WAIT_SECONDS``)."""
    client_token: str | None = Field(None, validation_alias="DEX_CLIENT_TOKEN", repr=False)
    """With any token set, auth is on: clients send this one (``DEX_CLIENT_TOKEN``)."""
    worker_token: str | None = Field(None, validation_alias="DEX_WORKER_TOKEN", repr=False)
    """What Workers send (``DEX_WORKER_TOKEN``)."""
    admin_token: str | None = Field(None, validation_alias="DEX_ADMIN_TOKEN", repr=False)
    """Opens everything, ``/metrics`` included (``DEX_ADMIN_TOKEN``)."""
    tokens_file: Path | None = Field(None, validation_alias="DEX_TOKENS_FILE")
    """A TOML file of tokens by their SHA-256, with roles, agent scopes and rate limits
    (``DEX_TOKENS_FILE``; see ``dex.server.api.tokens``). Read again when it changes."""
    rate_limit: str | None = Field(None, validation_alias="DEX_RATE_LIMIT")
    """Each token's limit on the client API, like ``"20/second; 600/minute"``
    (``DEX_RATE_LIMIT``); None: no limit unless a token's entry sets one."""
    tls_cert: Path | None = Field(None, validation_alias="DEX_TLS_CERT")
    """Serve HTTPS and WSS with this certificate chain (PEM; ``DEX_TLS_CERT``)."""
    tls_key: Path | None = Field(None, validation_alias="DEX_TLS_KEY")
    """... and this private key (PEM; ``DEX_TLS_KEY``)."""
    streams: str = Field("memory", validation_alias="DEX_STREAMS")
    """Where live events wait for subscribers (``DEX_STREAMS``): ``memory``, this node's,
    or ``redis://HOST:PORT[/DB]``, which survives a restart or a takeover (needs
    ``dex-runtime[redis]``; docs/streams.md)."""
    standby: bool = Field(False, validation_alias="DEX_STANDBY")
    """On PostgreSQL: own no partition while another node that is not a standby lives,
    and stand in for all of them when none does (``DEX_STANDBY``; docs/cluster.md)."""
    partitions: int = Field(64, ge=1, le=4096, validation_alias="DEX_PARTITIONS")
    """On PostgreSQL: how many partitions a new database's sessions are shared out in
    (``DEX_PARTITIONS``); a database keeps the number it was created with."""
    advertise: str | None = Field(None, validation_alias="DEX_ADVERTISE")
    """On PostgreSQL: the base URL other nodes and Workers reach this node at
    (``DEX_ADVERTISE``); None: ``http(s)://`` and ``listen``."""
    model_limits: dict[str, Limit] = Field(
        default_factory=dict, validation_alias="DEX_MODEL_LIMITS"
    )
    """Limits of model calls by model group (``DEX_MODEL_LIMITS``, JSON; in ``dex.toml``,
    ``[server.model_limits."anthropic/claude-sonnet-4-5"]`` with ``concurrency``, ``rpm``,
    ``tpm``): docs/flow-control.md. A limit set at run time replaces its group's."""
    tenant_weights: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, validation_alias="DEX_TENANT_WEIGHTS"
    )
    """Each tenant's share of the Workers while several wait (``DEX_TENANT_WEIGHTS``, JSON
    like ``{"acme": 3}``; 1 for a tenant not named): docs/flow-control.md."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict, validation_alias="DEX_PRICES")
    """Model prices over the ones Dex ships, by model name (``[server.prices]`` in the
    config file: ``"gpt-4o" = { input = 2.5, output = 10.0 }``, US dollars per million
    tokens; ``DEX_PRICES`` as JSON). A model priced nowhere costs nothing: its tokens still
    count (docs/flow-control.md, Prices)."""
    tracing: bool = Field(False, validation_alias="DEX_TRACING")
    """OpenTelemetry spans of turns, Steps and attempts (``DEX_TRACING``; needs
    ``dex-runtime[otel]``): see docs/operations.md."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @field_validator("streams")
    @classmethod
    def _streams(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"expected memory or redis://HOST:PORT[/DB], got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def address(self) -> str:
        """The base URL other nodes and Workers reach this node at."""
        if self.advertise:
            return self.advertise.rstrip("/")
        scheme = "https" if self.tls_cert is not None else "http"
        host = self.host
        if host in ("0.0.0.0", "::", "[::]"):
            import socket

            host = socket.gethostname()
        return f"{scheme}://{host}:{self.port}"

    @property
    def database_path(self) -> Path:
        return self.data_dir / "dex.sqlite3"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.database_path}"

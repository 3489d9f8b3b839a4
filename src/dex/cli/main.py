"""The ``dex`` command."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from dex import _loop
from dex._address import DEFAULT_ADDRESS
from dex._settings import Settings
from dex.cli import client_cmds, flow_cmds
from dex.cli.client_cmds import Address, print_json
from dex.errors import DexError

if TYPE_CHECKING:  # loaded by the commands that use them: `dex server` needs neither
    from dex.agent import Agent

S = TypeVar("S", bound=Settings)

app = typer.Typer(help="Dex: a durable runtime for AI agents.", no_args_is_help=True)
app.add_typer(client_cmds.app)  # the client commands: dex new, send, turn, reconcile...
app.add_typer(flow_cmds.app)  # the operator's: dex limits, dex tenants


def _version(value: bool) -> None:
    if value:
        import dex

        typer.echo(f"dex {dex.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option(envvar="DEX_LOG_LEVEL", help="debug, info, warning or error."),
    ] = "info",
    log_format: Annotated[
        str,
        typer.Option(
            envvar="DEX_LOG_FORMAT", help="console (for people) or json (one object a line)."
        ),
    ] = "console",
) -> None:
    """Dex: a durable runtime for AI agents."""
    from dex._logging import configure

    try:
        configure(log_level, log_format)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="DEX_CONFIG",
        help="A TOML file with a \\[server] and a \\[worker] table of these settings (flags and "
        "DEX_* variables win over it).",
    ),
]


def _settings(cls: type[S], config_file: Path | None, **flags: Any) -> S:
    """A settings object from flags (None: not given), then DEX_* variables, then the
    config file, then defaults; what does not fit is a usage error."""
    from pydantic import ValidationError

    try:
        return cls.load(config_file, **flags)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise typer.BadParameter(problems) from None
    except (ValueError, OSError) as e:  # no such file, or not TOML
        raise typer.BadParameter(str(e)) from None


def _tracing_on(service: str) -> None:
    from dex._otel import install_provider

    try:
        install_provider(service)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


Tracing = Annotated[
    bool | None,
    typer.Option(
        "--tracing/--no-tracing",
        show_default=False,
        help="OpenTelemetry spans (DEX_TRACING; needs dex-runtime\\[otel]), exported as the "
        "OTEL_* variables say (default: OTLP over HTTP).  \\[default: off]",
    ),
]


@app.command()
def server(
    config_file: ConfigFile = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Where SQLite keeps state (DEX_DATA_DIR).  \\[default: dex-data]"),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            help="sqlite:///path or postgresql://user@host:port/db (DEX_DATABASE).  "
            "\\[default: dex.sqlite3 in --data-dir]",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(help="HOST:PORT to serve on (DEX_LISTEN).  \\[default: 127.0.0.1:7450]"),
    ] = None,
    heartbeat_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds without a heartbeat before an attempt fails (DEX_HEARTBEAT_TIMEOUT)."
            "  \\[default: 10]",
        ),
    ] = None,
    reconnect_grace: Annotated[
        float | None,
        typer.Option(
            help="Seconds a dropped Worker's attempts wait for it to reconnect before they fail "
            "(DEX_RECONNECT_GRACE).  \\[default: 1]",
        ),
    ] = None,
    reclaim_window: Annotated[
        float | None,
        typer.Option(
            help="After a restart or takeover, seconds an attempt left running waits for its "
            "Worker to reclaim it before it fails; 0: at once (DEX_RECLAIM_WINDOW).  "
            "\\[default: 3]",
        ),
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            help="On SIGTERM, seconds running attempts may take to finish before they fail "
            "(DEX_SERVER_DRAIN_TIMEOUT).  \\[default: 20]",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int | None,
        typer.Option(
            help="Larger request bodies are refused with 413 (DEX_MAX_BODY_BYTES).  "
            "\\[default: 1048576]"
        ),
    ] = None,
    client_token: Annotated[
        str | None,
        typer.Option(help="Turn auth on: the token clients must send (DEX_CLIENT_TOKEN)."),
    ] = None,
    worker_token: Annotated[
        str | None, typer.Option(help="The token Workers must send (DEX_WORKER_TOKEN).")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(help="A token that opens everything, /metrics too (DEX_ADMIN_TOKEN)."),
    ] = None,
    streams: Annotated[
        str | None,
        typer.Option(
            help="Where live events wait for subscribers: memory, or redis://HOST:PORT\\[/DB] "
            "to survive a restart or a takeover (DEX_STREAMS; needs dex-runtime\\[redis]).  "
            "\\[default: memory]",
        ),
    ] = None,
    standby: Annotated[
        bool | None,
        typer.Option(
            "--standby",
            envvar="DEX_STANDBY",
            help="On PostgreSQL: own no session while another node that is not a standby "
            "lives; stand in for all of them when none does (a hot standby).",
        ),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            envvar="DEX_PARTITIONS",
            help="On PostgreSQL: how many partitions a new database's sessions are shared out "
            "in.  \\[default: 64]",
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            envvar="DEX_ADVERTISE",
            help="On PostgreSQL: the base URL other nodes and Workers reach this node at.  "
            "\\[default: http://LISTEN]",
        ),
    ] = None,
    tracing: Tracing = None,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            envvar="DEX_TOKENS_FILE",
            help="Turn auth on with the tokens of this TOML file (SHA-256 hashes, roles, agent "
            "scopes, rate limits); read again when it changes or on SIGHUP. See dex token new.",
        ),
    ] = None,
    rate_limit: Annotated[
        str | None,
        typer.Option(
            envvar="DEX_RATE_LIMIT",
            help='Each token\'s limit on the client API, e.g. "20/second; 600/minute" '
            "(over it: 429 with Retry-After).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(envvar="DEX_TLS_CERT", help="Serve HTTPS with this certificate chain (PEM)."),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(envvar="DEX_TLS_KEY", help="The private key of --tls-cert (PEM)."),
    ] = None,
) -> None:
    """Run a Dex Server node on SQLite in DATA_DIR, or on the database --database names."""
    from dex.server.app import serve
    from dex.server.config import ServerConfig

    config = _settings(
        ServerConfig,
        config_file,
        data_dir=data_dir,
        database=database,
        listen=listen,
        heartbeat_timeout=heartbeat_timeout,
        reconnect_grace=reconnect_grace,
        reclaim_window=reclaim_window,
        drain_timeout=drain_timeout,
        max_body_bytes=max_body_bytes,
        client_token=client_token,
        worker_token=worker_token,
        admin_token=admin_token,
        streams=streams,
        standby=standby,
        partitions=partitions,
        advertise=advertise,
        tracing=tracing,
        tokens_file=tokens_file,
        rate_limit=rate_limit,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    if config.tracing:
        _tracing_on("dex-server")
    serve(config)


@app.command()
def worker(
    module: Annotated[
        str, typer.Argument(help="A module (my.agents) or file (agents.py) that defines Agents.")
    ],
    config_file: ConfigFile = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="Server address(es), comma-separated (DEX_ADDRESS).  "
            f"\\[default: {DEFAULT_ADDRESS}]"
        ),
    ] = None,
    capacity: Annotated[
        int | None,
        typer.Option(help="Attempts it runs at once (DEX_WORKER_CAPACITY).  \\[default: 16]"),
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            help="On SIGTERM, seconds running attempts may take to finish (DEX_DRAIN_TIMEOUT)."
            "  \\[default: 30]"
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="The worker token, when the server has auth on (DEX_WORKER_TOKEN)."),
    ] = None,
    tracing: Tracing = None,
) -> None:
    """Serve the agents that MODULE defines."""
    from dex.worker import Worker, WorkerConfig

    config = _settings(
        WorkerConfig,
        config_file,
        address=address,
        capacity=capacity,
        drain_timeout=drain_timeout,
        token=token,
        tracing=tracing,
    )
    agents = load_agents(module)
    if config.tracing:
        _tracing_on("dex-worker")
    _loop.tune_gc()  # this process is Dex's own: a program that embeds a Worker keeps its GC
    try:
        Worker(agents, config=config).run_forever()
    except DexError as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None


@app.command()
def token(
    role: Annotated[str, typer.Argument(help="client, worker or admin.")],
    name: Annotated[str | None, typer.Option(help="Its name in logs and 429s.")] = None,
    agents: Annotated[
        str | None,
        typer.Option(help="A worker token's scope: the agents it may serve, comma-separated."),
    ] = None,
    rate_limit: Annotated[
        str | None, typer.Option(help='This token\'s client API limit, e.g. "20/second".')
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="A client token's scope: the one tenant whose sessions it sees."),
    ] = None,
) -> None:
    """Make a new random token: print it once (give it to its holder) and the entry that
    lets it in (append it to the --tokens-file; only its SHA-256 is kept there)."""
    import secrets

    from dex.server.api.tokens import Role, check_rate_limit, check_tenant, digest

    if role not in set(Role):
        raise typer.BadParameter(f"role {role!r}: client, worker or admin")
    if agents is not None and role != Role.WORKER:
        raise typer.BadParameter("--agents limits a worker token")
    try:
        if rate_limit is not None:
            check_rate_limit(rate_limit)
        if tenant is not None:
            check_tenant(tenant, role, "--tenant: ")
    except DexError as e:
        raise typer.BadParameter(e.message) from None
    value = f"dex_{role[0]}_{secrets.token_urlsafe(32)}"
    lines = ["[[token]]"]
    if name:
        lines.append(f"name = {json.dumps(name)}")
    lines += [f'role = "{role}"', f'sha256 = "{digest(value).hex()}"']
    if agents is not None:
        lines.append(f"agents = {json.dumps([a.strip() for a in agents.split(',') if a.strip()])}")
    if rate_limit is not None:
        lines.append(f"rate_limit = {json.dumps(rate_limit)}")
    if tenant is not None:
        lines.append(f"tenant = {json.dumps(tenant)}")
    typer.echo(f"# the token (shown once; the file keeps only its hash): {value}", err=True)
    typer.echo("\n".join(lines))


@app.command()
def demo(
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory (default: a new temporary one).")
    ] = None,
    port: Annotated[int, typer.Option(envvar="DEX_DEMO_PORT")] = 7451,
) -> None:
    """Start a server and a Worker, talk to an agent, SIGKILL the Worker mid-tool, and show
    what Dex did about it."""
    from dex.demo import run

    raise typer.Exit(run(data_dir, port))


@app.command()
def chat(
    agent: Annotated[
        str | None,
        typer.Argument(help="The agent to talk to (default: the only one a Worker serves)."),
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Go on with this session.")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="A new session's tenant (default: a tenant-scoped token's, else none)."),
    ] = None,
    address: Address = DEFAULT_ADDRESS,
) -> None:
    """Talk to an agent in the terminal: its text streams as it comes, tool calls show as
    they run, approvals and questions are asked here, and the chat picks up where it was
    when the server restarts."""
    from dex.cli import chat as chat_module

    try:
        chat_module.run(address, agent, session, tenant)
    except DexError as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None


class McpTransport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"


@app.command()
def mcp(
    transport: Annotated[
        McpTransport,
        typer.Option(
            envvar="DEX_MCP_TRANSPORT",
            help="stdio (an MCP client starts this command) or http (Streamable HTTP at "
            "http://HOST:PORT/mcp).",
        ),
    ] = McpTransport.STDIO,
    host: Annotated[
        str, typer.Option(envvar="DEX_MCP_HOST", help="With --transport http: where to listen.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(envvar="DEX_MCP_PORT", help="With --transport http: the port.")
    ] = 7460,
    wait: Annotated[
        float,
        typer.Option(
            envvar="DEX_MCP_WAIT",
            min=0,
            max=600,
            help="Seconds a tool call waits for a turn before it answers 'running' (a call "
            "may ask for up to 600).",
        ),
    ] = 50.0,
    address: Address = DEFAULT_ADDRESS,
) -> None:
    """Serve Dex's agents to MCP clients (Claude Desktop, IDEs, other agents): tools to
    list agents, start sessions, send messages and act on what a turn waits for. Sends
    DEX_CLIENT_TOKEN; over http, a request's own Authorization: Bearer token instead.
    Needs dex-runtime\\[mcp]."""
    import asyncio

    try:
        from dex import mcp_server
    except ImportError as e:
        typer.echo(
            f"error: dex mcp needs the MCP SDK: pip install 'dex-runtime[mcp]' ({e})", err=True
        )
        raise typer.Exit(1) from None
    try:
        dex_ = mcp_server.Dex(address, wait=wait)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if transport == McpTransport.STDIO:
        asyncio.run(mcp_server.serve_stdio(dex_))
    else:
        asyncio.run(mcp_server.serve_http(dex_, host, port))


@app.command("step-down")
def step_down(
    address: Annotated[
        str, typer.Option(envvar="DEX_ADDRESS", help="The address of the node to step down.")
    ] = DEFAULT_ADDRESS,
) -> None:
    """Step the active node down on purpose (a deploy): it drains, gives the lease up at once
    and exits; a standby takes over. Sends DEX_ADMIN_TOKEN when set."""
    import os
    import urllib.error
    import urllib.request

    token = os.environ.get("DEX_ADMIN_TOKEN")
    request = urllib.request.Request(
        address.split(",")[0].rstrip("/") + "/admin/step-down",
        method="POST",
        headers={"authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            print_json(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        message = json.loads(e.read() or b"{}").get("error", {}).get("message", str(e))
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from None
    except OSError as e:
        typer.echo(f"error: cannot reach {address}: {e}", err=True)
        raise typer.Exit(1) from None


def load_agents(module: str) -> list[Agent]:
    """Every ``Agent`` defined at the top level of a module or a Python file."""
    from dex.agent import Agent

    if module.endswith(".py") or "/" in module:
        path = Path(module)
        if not path.exists():
            raise typer.BadParameter(f"no such file: {module}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = loaded
        spec.loader.exec_module(loaded)
    else:
        sys.path.insert(0, ".")
        try:
            loaded = importlib.import_module(module)
        except ImportError as e:
            raise typer.BadParameter(f"cannot import {module}: {e}") from None
    agents = [v for v in vars(loaded).values() if isinstance(v, Agent)]
    if not agents:
        raise typer.BadParameter(f"{module} defines no dex.Agent at its top level")
    return agents


def main() -> None:
    app()

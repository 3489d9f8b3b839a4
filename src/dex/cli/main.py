"""The ``dex`` command."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dex._address import DEFAULT_ADDRESS
from dex.errors import DexError

if TYPE_CHECKING:  # loaded by the commands that use them: `dex server` needs neither
    from dex.agent import Agent
    from dex.client import SyncClient

app = typer.Typer(help="Dex: a durable runtime for AI agents.", no_args_is_help=True)


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


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


@app.command()
def server(
    data_dir: Annotated[
        Path, typer.Option(envvar="DEX_DATA_DIR", help="Where SQLite keeps state.")
    ] = Path("dex-data"),
    database: Annotated[
        str | None,
        typer.Option(
            envvar="DEX_DATABASE",
            help="sqlite:///path or postgresql://user@host:port/db "
            "(default: dex.sqlite3 in --data-dir).",
        ),
    ] = None,
    listen: Annotated[
        str, typer.Option(envvar="DEX_LISTEN", help="HOST:PORT to serve on.")
    ] = "127.0.0.1:7450",
    heartbeat_timeout: Annotated[
        float,
        typer.Option(
            envvar="DEX_HEARTBEAT_TIMEOUT",
            help="Seconds without a heartbeat before an attempt fails.",
        ),
    ] = 10.0,
    reconnect_grace: Annotated[
        float,
        typer.Option(
            envvar="DEX_RECONNECT_GRACE",
            help="Seconds a dropped Worker's attempts wait for it to reconnect before they fail.",
        ),
    ] = 1.0,
    drain_timeout: Annotated[
        float,
        typer.Option(
            envvar="DEX_SERVER_DRAIN_TIMEOUT",
            help="On SIGTERM, seconds running attempts may take to finish before they fail.",
        ),
    ] = 20.0,
    max_body_bytes: Annotated[int, typer.Option(envvar="DEX_MAX_BODY_BYTES")] = 1 << 20,
    client_token: Annotated[
        str | None,
        typer.Option(envvar="DEX_CLIENT_TOKEN", help="Turn auth on: the token clients must send."),
    ] = None,
    worker_token: Annotated[
        str | None, typer.Option(envvar="DEX_WORKER_TOKEN", help="The token Workers must send.")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(envvar="DEX_ADMIN_TOKEN", help="A token that opens everything, /metrics too."),
    ] = None,
) -> None:
    """Run a Dex Server node on SQLite in DATA_DIR, or on the database --database names."""
    from dex.server.app import serve
    from dex.server.config import ServerConfig

    host, port = _listen(listen)
    serve(
        ServerConfig(
            data_dir=data_dir,
            database=database,
            host=host,
            port=port,
            heartbeat_timeout=heartbeat_timeout,
            reconnect_grace=reconnect_grace,
            drain_timeout=drain_timeout,
            max_body_bytes=max_body_bytes,
            client_token=client_token,
            worker_token=worker_token,
            admin_token=admin_token,
        )
    )


@app.command()
def worker(
    module: Annotated[
        str, typer.Argument(help="A module (my.agents) or file (agents.py) that defines Agents.")
    ],
    address: Annotated[
        str, typer.Option(envvar="DEX_ADDRESS", help="Server address(es), comma-separated.")
    ] = DEFAULT_ADDRESS,
    capacity: Annotated[int, typer.Option(envvar="DEX_WORKER_CAPACITY")] = 16,
    drain_timeout: Annotated[float, typer.Option(envvar="DEX_DRAIN_TIMEOUT")] = 30.0,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="DEX_WORKER_TOKEN", help="The worker token, when the server has auth on."
        ),
    ] = None,
) -> None:
    """Serve the agents that MODULE defines."""
    from dex.worker import Worker, WorkerConfig

    agents = load_agents(module)
    try:
        Worker(
            agents,
            address,
            WorkerConfig(capacity=capacity, drain_timeout=drain_timeout, token=token),
        ).run_forever()
    except DexError as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None


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


Address = Annotated[str, typer.Option(envvar="DEX_ADDRESS", help="Server address(es).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]
# Client commands send DEX_CLIENT_TOKEN when the server has auth on (dex.Client reads it).
By = Annotated[str | None, typer.Option(help="Who does it (recorded).")]


def _call(address: str, action: Callable[[SyncClient], Any]) -> None:
    """Run one client call and print its JSON; a Dex error is a message, not a traceback."""
    from dex.client import SyncClient

    with SyncClient(address) as client:
        try:
            value = action(client)
            if value is not None:
                _print(value)
        except DexError as e:
            typer.echo(f"error: {e.message}", err=True)
            raise typer.Exit(1) from None


@app.command()
def workers(address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False) -> None:
    """The Workers connected to the server: agents, tools, capacity, running attempts."""

    def show(client: SyncClient) -> Any:
        found = client.list_workers()
        if json_output:
            return found
        if not found:
            typer.echo("no Worker is connected: start one with `dex worker MODULE`")
            return None
        for w in found:
            agents = ", ".join(
                f"{a['name']} ({', '.join(a['tools']) or 'no tools'})" for a in w["agents"]
            )
            typer.echo(
                f"{w['worker_id']}  capacity {w['capacity']}  running {len(w['running'])}"
                f"{'  draining' if w['draining'] else ''}\n  serves {agents}"
            )
        return None

    _call(address, show)


@app.command()
def events(
    session_id: str,
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Follow a session's events as they happen (turns, waits, history items, model text)
    until interrupted."""
    import asyncio

    from dex.client import Client

    async def follow() -> None:
        async with Client(address) as client:
            async for event in client.stream_events(session_id):
                if json_output:
                    typer.echo(json.dumps(event, sort_keys=True))
                elif event["type"] == "model.delta":
                    typer.echo(event["data"].get("text", ""), nl=False)
                else:
                    data = {k: v for k, v in event["data"].items() if k != "type"}
                    typer.echo(f"\n[{event['id']}] {event['type']} {json.dumps(data)}")

    try:
        asyncio.run(follow())
    except DexError as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


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
            _print(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        message = json.loads(e.read() or b"{}").get("error", {}).get("message", str(e))
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from None
    except OSError as e:
        typer.echo(f"error: cannot reach {address}: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def new(agent: str, address: Address = DEFAULT_ADDRESS) -> None:
    """Create a session with AGENT and print it."""
    _call(address, lambda c: c.create_session(agent))


@app.command()
def snapshot(session_id: str, address: Address = DEFAULT_ADDRESS) -> None:
    """Print a session's agent snapshot as JSON."""
    _call(address, lambda c: c.get_agent_snapshot(session_id))


@app.command()
def send(
    session_id: str,
    text: str,
    address: Address = DEFAULT_ADDRESS,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the turn to end.")] = 60.0,
) -> None:
    """Send a message to a session and print its turn."""
    _call(address, lambda c: c.send_message(session_id, text, wait=wait > 0, timeout=wait))


@app.command()
def approvals(session_id: str, address: Address = DEFAULT_ADDRESS) -> None:
    """List the tool calls that wait for approval."""
    _call(address, lambda c: c.list_approvals(session_id))


@app.command()
def approve(
    session_id: str,
    call_id: str,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    arguments_hash: Annotated[
        str | None, typer.Option(help="The arguments_hash you reviewed: refuse any other.")
    ] = None,
) -> None:
    """Approve a tool call: it runs once."""
    _call(address, lambda c: c.approve(session_id, call_id, by=by, arguments_hash=arguments_hash))


@app.command()
def deny(
    session_id: str, call_id: str, reason: str, address: Address = DEFAULT_ADDRESS, by: By = None
) -> None:
    """Deny a tool call: the model sees REASON."""
    _call(address, lambda c: c.deny(session_id, call_id, reason, by=by))


@app.command()
def answer(
    session_id: str, call_id: str, text: str, address: Address = DEFAULT_ADDRESS, by: By = None
) -> None:
    """Answer the question a tool asked."""
    _call(address, lambda c: c.answer(session_id, call_id, text, by=by))


@app.command()
def cancel(
    session_id: str,
    address: Address = DEFAULT_ADDRESS,
    reason: Annotated[str, typer.Option()] = "cancelled from the command line",
) -> None:
    """Cancel the running turn of a session."""
    _call(address, lambda c: c.cancel_turn(session_id, reason))


@app.command()
def reconcile(
    session_id: str,
    call_id: str,
    status: Annotated[str, typer.Option(help="What really happened: succeeded or failed.")],
    address: Address = DEFAULT_ADDRESS,
    result: Annotated[str | None, typer.Option(help="The result, as JSON.")] = None,
    error: Annotated[str | None, typer.Option(help="What went wrong, if it failed.")] = None,
    by: By = None,
) -> None:
    """Record what really happened to an outcome_unknown tool call."""
    try:
        value = json.loads(result) if result is not None else None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"--result is not JSON: {e}") from None
    _call(
        address,
        lambda c: c.reconcile(session_id, call_id, status=status, result=value, error=error, by=by),
    )


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


def _print(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def main() -> None:
    app()

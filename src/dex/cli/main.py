"""The ``dex`` command."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dex._address import DEFAULT_ADDRESS
from dex.agent import Agent

app = typer.Typer(
    help="Dex: a durable runtime for AI agents.", no_args_is_help=True, add_completion=False
)


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
    max_body_bytes: Annotated[int, typer.Option(envvar="DEX_MAX_BODY_BYTES")] = 1 << 20,
) -> None:
    """Run a Dex Server node on SQLite in DATA_DIR."""
    from dex.server.app import serve
    from dex.server.config import ServerConfig

    host, port = _listen(listen)
    _logging()
    serve(
        ServerConfig(
            data_dir=data_dir,
            host=host,
            port=port,
            heartbeat_timeout=heartbeat_timeout,
            max_body_bytes=max_body_bytes,
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
) -> None:
    """Serve the agents that MODULE defines."""
    from dex.worker import Worker, WorkerConfig

    agents = load_agents(module)
    _logging()
    Worker(
        agents, address, WorkerConfig(capacity=capacity, drain_timeout=drain_timeout)
    ).run_forever()


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
def snapshot(
    session_id: str,
    address: Annotated[str, typer.Option(envvar="DEX_ADDRESS")] = DEFAULT_ADDRESS,
) -> None:
    """Print a session's agent snapshot as JSON."""
    from dex.client import SyncClient

    with SyncClient(address) as client:
        _print(client.get_agent_snapshot(session_id))


@app.command()
def send(
    session_id: str,
    text: str,
    address: Annotated[str, typer.Option(envvar="DEX_ADDRESS")] = DEFAULT_ADDRESS,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the turn to end.")] = 60.0,
) -> None:
    """Send a message to a session and print its turn."""
    from dex.client import SyncClient

    with SyncClient(address) as client:
        _print(client.send_message(session_id, text, wait=wait > 0, timeout=wait))


def load_agents(module: str) -> list[Agent]:
    """Every ``Agent`` defined at the top level of a module or a Python file."""
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


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )


def main() -> None:
    app()

"""A stateless Worker: holds agent definitions in code and runs the Steps it is handed.

It keeps one WebSocket to the active node (``dex.worker.connection``; the messages are
``dex.wire.worker_frames`` and ``dex.wire.server_frames``), or in a cluster one to each
node, learnt from the node it reaches (``dex.worker.cluster``), reconnects by itself,
heartbeats every attempt it holds, and keeps each result until the server acknowledges
it, sending it again after a reconnect (``dex.worker.runner``). A result the server
refuses (its attempt was failed meanwhile) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from dex import _loop
from dex._address import addresses
from dex.agent import Agent
from dex.models.base import Model
from dex.tools import ToolSource
from dex.wire.worker_frames import Drain
from dex.worker.cluster import Cluster
from dex.worker.config import WorkerConfig
from dex.worker.connection import Connection
from dex.worker.runner import Runner

if TYPE_CHECKING:
    from dex.worker.tracing import AttemptTracing

log = logging.getLogger("dex.worker")


class Worker:
    """Serves ``agents``: runs the Steps the server hands it, up to ``config.capacity`` at
    once, reconnecting by itself, until ``shutdown()`` (or a signal, in ``run_forever``).

    **Workers in a cluster.** Give it the address of any node (or several: the seed). The
    node it reaches lists every node of the cluster in its welcome, and the Worker keeps
    one connection to each (each node hands out only its own sessions' Steps), learns of
    nodes that join or leave as it goes, and stops reconnecting to a node that left once
    its connection is down. The connections share one capacity: each node is told the
    whole of it, so a node's view is an upper bound, and a Step that comes while the
    Worker runs as many attempts as its capacity is handed back at once to go to another
    Worker. Each connection logs its own lines (``worker.connected``,
    ``worker.connection_lost``, ``worker.reconnected``) with its node's address. Give a
    Worker the nodes' own addresses rather than a load balancer's: the connection
    through a load balancer counts for that address only, so the Worker's connection to
    the same node by its own address is refused (the Worker id is in use) until it ends.
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        address: str | Sequence[str] | None = None,
        config: WorkerConfig | None = None,
        *,
        tracer_provider: Any = None,
    ) -> None:
        """``tracer_provider``: where spans go when ``config.tracing`` is on (default:
        OpenTelemetry's global provider)."""
        if not agents:
            raise ValueError("a Worker needs at least one agent")
        self.agents = {a.name: a for a in agents}
        if len(self.agents) != len(agents):
            raise ValueError("two agents share a name")
        self.config = config or WorkerConfig()
        self.addresses = addresses(address or self.config.address)
        self.id = self.config.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        token = self.config.token or os.environ.get("DEX_WORKER_TOKEN")
        tracing: AttemptTracing | None = None
        if self.config.tracing:
            from dex.worker.tracing import AttemptTracing  # only when tracing is on

            tracing = AttemptTracing(self.id, tracer_provider)
        self._runner = Runner(self.id, self.agents, self.config.capacity, tracing)
        served = list(agents)

        def connection(to: Sequence[str], cluster: Cluster) -> Connection:
            return Connection(self.id, served, to, self.config, token, self._runner, cluster)

        self._cluster = Cluster(self.addresses, connection)
        self._stop_reason = "shutdown"
        """Why the Worker drains: ``shutdown`` (called in code), or a signal's name."""
        self._signalled: asyncio.Future[None] | None = None
        """The drain a signal started (kept: a task nobody holds may be collected)."""
        self._draining = False
        self._stopped = asyncio.Event()
        self._running = False

    async def __aenter__(self) -> Worker:
        self._main = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def run(self) -> None:
        """Serve until ``shutdown()``. Calling it while it runs does nothing."""
        if self._running:
            await self._stopped.wait()
            return
        self._running = True
        try:
            for model in self._models():
                model.warm_up()
            await self._open_sources()
            async with aiohttp.ClientSession() as http:
                await self._cluster.run(http)
        except Exception as e:
            self._cluster.seed.log.stopped("error", e)
            raise
        else:
            self._cluster.seed.log.stopped(self._stop_reason)
        finally:
            for source in self._sources():
                try:
                    await source.aclose()
                except Exception:
                    log.exception(
                        "closing a tool source failed", extra={"action": "worker.close_tools"}
                    )
            for model in self._models():
                try:
                    await model.aclose()
                except Exception:
                    log.exception("closing a model failed", extra={"action": "worker.close_model"})
            self._stopped.set()

    def _sources(self) -> list[ToolSource]:
        return list({id(s): s for a in self.agents.values() for s in a.sources}.values())

    async def _open_sources(self) -> None:
        """List the tools of each source (an MCP server) before the first hello: the
        agents register them, and offer the model these, for the life of the process."""
        for source in self._sources():
            await source.open()
        for agent in self.agents.values():
            agent.check_tools()

    def _models(self) -> list[Model]:
        return list({id(a.model): a.model for a in self.agents.values()}.values())

    def run_forever(self) -> None:
        """Run in this thread until SIGINT or SIGTERM, then drain and exit."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
            await self.run()

        _loop.run(main())

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._draining:
            self._stop_reason = sig.name
        self._signalled = asyncio.ensure_future(self.shutdown())

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop taking Steps, let running ones finish (up to the drain timeout), hand back
        what had not started, and close. Safe to call more than once."""
        if not self._draining:
            self._draining = True
            await self._drain(self.config.drain_timeout if timeout is None else timeout)
            self._cluster.stop()
        if self._running:
            await self._stopped.wait()

    async def _drain(self, timeout: float) -> None:
        runner = self._runner
        running = len(runner.attempts)
        log.info(
            "draining: taking no new Steps, finishing %d running attempts within %gs",
            running,
            timeout,
            extra={"action": "worker.draining", "running": running, "timeout": timeout},
        )
        self._cluster.send_all(Drain())
        await runner.finish(timeout)
        # wait (briefly) for the server to acknowledge what we sent
        if runner.attempts and self._cluster.linked:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runner.none_held.wait(), min(timeout, 5.0))

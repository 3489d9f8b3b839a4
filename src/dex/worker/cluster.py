"""A Worker's connections to the nodes of a cluster.

In a cluster each node hands out only the Steps of its own sessions, so a Worker must be
connected to every node. The configured addresses are the seed: one connection tries them
in turn, as on a single node. A node's ``welcome`` (and later ``members`` frames) lists
the base URLs of every node the Worker should be connected to; the Worker keeps one
connection to each it is not connected to yet (the seed counts for the address it is
on), each with its own reconnect loop. A member that no connected node lists any more
and whose connection is down is let go: nothing reconnects to a node that left. The seed
stays, but while down it tries again only an address a connected node lists, or once no
node is connected. While no node is connected, nothing is let go. All connections share
one ``Runner``, so one capacity (``dex.worker.runner``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aiohttp

from dex.wire.worker_frames import WorkerMessage
from dex.worker.connection import Connection


class Cluster:
    def __init__(
        self,
        addresses: Sequence[str],
        connection: Callable[[Sequence[str], Cluster], Connection],
    ) -> None:
        """``addresses``: the seed's. ``connection(addresses, cluster)``: a new connection of
        the Worker's to ``addresses``, one of ``cluster``'s."""
        self._connection = connection
        self.seed = connection(addresses, self)
        self.members: dict[str, Connection] = {}
        """The connections to the nodes the seed is not on, by address."""
        self._tasks: dict[Connection, asyncio.Task[None]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._failed: asyncio.Future[None] | None = None
        """Set when a member connection gives up for good (a refused token, say)."""
        self._stopping = False
        self._change = asyncio.Event()
        """Set (and replaced) at each ``changed()``."""

    @property
    def connections(self) -> list[Connection]:
        return [self.seed, *self.members.values()]

    @property
    def linked(self) -> bool:
        """Whether any connection is up."""
        return any(c.link is not None for c in self.connections)

    def send_all(self, message: WorkerMessage) -> None:
        for connection in self.connections:
            connection.send(message)

    def taken(self, address: str, by: Connection | None) -> bool:
        """Whether a connection other than ``by`` is on (or tries) ``address``."""
        return any(c is not by and c.address == address for c in self.connections)

    def listed(self) -> set[str] | None:
        """The nodes the connected nodes list; None while no node is connected."""
        lists = [
            c.members for c in self.connections if c.link is not None and c.members is not None
        ]
        if not lists:
            return None
        return set().union(*lists)

    def wanted(self, connection: Connection) -> bool:
        """Whether ``connection`` should (re)connect: while it is up, while a connected
        node lists its address, or while no node is connected. (A seed address that is
        not a member's, a node that left or a load balancer, is tried again only when
        no node is connected.)"""
        if connection.link is not None:
            return True
        listed = self.listed()
        return listed is None or connection.address in listed

    async def change(self, stopping: asyncio.Event) -> None:
        """Wait for the next ``changed()``, or ``stopping``."""
        waits = [
            asyncio.ensure_future(self._change.wait()),
            asyncio.ensure_future(stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def changed(self) -> None:
        """A node listed its members, or a connection came up or went down: connect to
        every listed node that no connection is on; let go of those no node lists."""
        self._change.set()
        self._change = asyncio.Event()
        if self._http is None or self._stopping:
            return
        listed = self.listed()
        if listed is None:
            return
        for address in sorted(listed):
            if not self.taken(address, None):
                self._start(address)
        for address, connection in list(self.members.items()):
            if connection.link is None and address not in listed:
                connection.let_go = True
                connection.stopping.set()

    def _start(self, address: str) -> None:
        assert self._http is not None
        connection = self._connection([address], self)
        self.members[address] = connection
        task = asyncio.create_task(connection.run(self._http))
        self._tasks[connection] = task
        task.add_done_callback(lambda t: self._ended(connection, t))

    def _ended(self, connection: Connection, task: asyncio.Task[None]) -> None:
        self._tasks.pop(connection, None)
        if self.members.get(connection.address) is connection:
            del self.members[connection.address]
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is not None and self._failed is not None and not self._failed.done():
            self._failed.set_exception(error)

    async def run(self, http: aiohttp.ClientSession) -> None:
        """Serve until ``stop()``; raises what made a connection give up for good."""
        self._http = http
        self._failed = asyncio.get_running_loop().create_future()
        seed = asyncio.create_task(self.seed.run(http))
        try:
            await asyncio.wait([seed, self._failed], return_when=asyncio.FIRST_COMPLETED)
            if self._failed.done():
                self._failed.result()  # raises what the member connection gave up on
            seed.result()
        finally:
            self.stop()
            seed.cancel()
            self._failed.cancel()
            await asyncio.gather(seed, *self._tasks.values(), return_exceptions=True)

    def stop(self) -> None:
        """Close every connection (the Worker has drained)."""
        self._stopping = True
        for connection in self.connections:
            connection.stopping.set()

"""A Worker's connection to one node: connect, say hello, reconnect.

It keeps one WebSocket to a node, tries its addresses in turn with backoff until one
serves, says ``hello`` (re-claiming, after a reconnect, every attempt it was handed and
the Worker still holds), sends again the results its node never acknowledged,
heartbeats those attempts, claims the Worker's strays (``Runner.strays``), and passes
what the node sends to the ``Runner``. Messages go out through the link's outbox
(``dex.wire.outbox``): what is ready leaves as one frame. In a cluster the Worker holds
one per node (``dex.worker.cluster``): the seed, on the configured addresses, and one per
member the nodes list.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from dex import _failpoints as failpoints
from dex.agent import Agent
from dex.errors import AuthError
from dex.wire import server_frames as frames
from dex.wire.outbox import Outbox
from dex.wire.protocol import CLOSE_FORBIDDEN
from dex.wire.worker_frames import Claim, Done, Drain, Hello, WorkerMessage
from dex.worker.config import WorkerConfig
from dex.worker.connection_log import ConnectionLog
from dex.worker.history import HistoryCache
from dex.worker.runner import Runner

if TYPE_CHECKING:
    from dex.worker.cluster import Cluster

log = logging.getLogger("dex.worker")


@dataclass(eq=False)
class Link:
    """One live connection."""

    ws: aiohttp.ClientWebSocketResponse
    address: str
    heartbeat_interval: float
    welcome: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the node answered hello (a standby closes the connection before that)."""
    ended: str = "the connection closed"
    """How it ended, as the node or the network said."""
    outbox: Outbox[Hello | WorkerMessage] = field(init=False)

    def __post_init__(self) -> None:
        self.outbox = Outbox(self._send)

    async def _send(self, frame: bytes, batch: list[Hello | WorkerMessage]) -> None:
        await self.ws.send_bytes(frame)
        if any(type(m) is Done for m in batch):
            failpoints.hit("worker.after_send_result")


class Connection:
    def __init__(
        self,
        worker_id: str,
        agents: Sequence[Agent],
        addresses: Sequence[str],
        config: WorkerConfig,
        token: str | None,
        runner: Runner,
        cluster: Cluster | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.agents = agents
        self.addresses = addresses
        self.address = addresses[0]
        """The address it is on, or tries, or tried last."""
        self.config = config
        self.runner = runner
        self.cluster = cluster
        self.link: Link | None = None
        self.members: list[str] | None = None
        """The nodes its node listed last (``welcome``, then ``members``), while connected."""
        self.stopping = asyncio.Event()
        self.let_go = False
        """A member no connected node lists any more: it stops once its connection is down."""
        self.histories = HistoryCache()
        """The history views this connection's node sent (``history_base`` counts on them)."""
        self.log = ConnectionLog(worker_id, [a.name for a in agents], config.capacity)
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self.resume: str | None = None
        """The resume token of the last welcome: proves a reconnect is this process (and,
        in a cluster, a ``claim`` of an attempt handed out under it, on another node)."""

    def send(self, message: WorkerMessage) -> None:
        """Put ``message`` on the live connection; without one it is dropped (a result is
        kept by its attempt, and sent again on the next connection)."""
        if self.link is not None:
            self.link.outbox.put(message)

    def _wanted(self) -> bool:
        """Whether to (re)connect now: not while stopping, nor (in a cluster) while down
        and listed by no connected node."""
        return not self.stopping.is_set() and (self.cluster is None or self.cluster.wanted(self))

    def _next(self, targets: itertools.cycle[str]) -> str:
        """The next address to try: in turn, but none that another of the Worker's
        connections is on (two connections of one Worker id to one node refuse each
        other); the current one if all are."""
        for _ in self.addresses:
            address = next(targets)
            if self.cluster is None or not self.cluster.taken(address, self):
                return address
        return self.address

    async def run(self, http: aiohttp.ClientSession) -> None:
        """Connect to the addresses in turn, with exponential backoff and full jitter
        between failed tries (tenacity), until ``stopping``. A connection that closes
        starts again from the shortest wait. In a cluster, while no connected node lists
        its address and it is down, it does not reconnect: a member stops for good (the
        node left), the seed waits until it is listed again or no node is connected."""
        targets = itertools.cycle(self.addresses)
        while not self.stopping.is_set():
            if not self._wanted():
                if not self._idle_seed():
                    self.log.let_go(self.address)
                    return
                assert self.cluster is not None
                await self.cluster.change(self.stopping)
                continue
            base = ""
            retrying = AsyncRetrying(
                wait=wait_random_exponential(
                    multiplier=self.config.reconnect_initial, max=self.config.reconnect_max
                ),
                sleep=self._pause,
                stop=lambda _: not self._wanted(),
                retry=retry_if_exception_type(_Unreachable),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        base = self.address = self._next(targets)
                        ws = await self._connect(http, base)
            except _Unreachable:  # shutting down, or no connected node lists it any more
                if self.let_go:
                    self.log.let_go(self.address)
                    return
                continue
            link = Link(ws, base, self.config.heartbeat_interval)
            try:
                async with ws:
                    await self._serve(link)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                link.ended = str(e) or type(e).__name__
            finally:
                self.members = None
                if self.cluster is not None:
                    self.cluster.changed()
            if self.stopping.is_set() and not self.let_go:
                return  # shutting down
            if link.welcome.is_set():
                reconnecting = self._wanted()
                self.log.lost(base, link.ended, reconnecting=reconnecting)
                if not reconnecting and not self._idle_seed():
                    return
            else:  # accepted, then closed before its welcome: a standby, say
                self.log.failed(base, link.ended)
            # a node that accepts and closes at once (a standby) is not asked again at once
            await self._pause(self.config.reconnect_initial * random.uniform(0.5, 1.0))

    def _idle_seed(self) -> bool:
        """Whether it is the seed (which waits, unwanted, rather than stop)."""
        return self.cluster is None or self is self.cluster.seed

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless ``stopping`` comes first (shutting down, or a member let go)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _connect(
        self, http: aiohttp.ClientSession, base: str
    ) -> aiohttp.ClientWebSocketResponse:
        url = base.replace("http://", "ws://").replace("https://", "wss://")
        try:
            # a node that hung accepts the TCP connection and never answers the upgrade:
            # give up on it after a while and try the next address
            return await asyncio.wait_for(
                http.ws_connect(
                    url + "/v1/workers/connect",
                    max_msg_size=64 << 20,
                    autoping=True,
                    heartbeat=self.config.ping_interval,
                    headers=self._auth,
                ),
                self.config.connect_timeout,
            )
        except aiohttp.WSServerHandshakeError as e:
            if e.status in (401, 403):
                why = "no worker token" if e.status == 401 else "a token without the worker role"
                message = (
                    f"{base} refused this Worker (HTTP {e.status}: {why}): set "
                    "DEX_WORKER_TOKEN (or WorkerConfig(token=...)) to the server's worker token"
                )
                log.error(message, extra={"action": "worker.unauthorized", "address": base})
                raise AuthError(message) from None
            self.log.failed(base, e)
            raise _Unreachable(base) from e
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.log.failed(base, str(e) or type(e).__name__)
            raise _Unreachable(base) from e

    async def _serve(self, link: Link) -> None:
        runner = self.runner
        link.outbox.put(
            Hello(
                worker_id=self.worker_id,
                agents=[a.spec() for a in self.agents],
                capacity=self.config.capacity,
                # on a reconnect: re-claim what this process still holds
                attempts=runner.held_by(self),
                resume=self.resume,
                history_cache=self.histories.sessions,
            )
        )
        if runner.draining:
            link.outbox.put(Drain())
        # results the last node never acknowledged: send them again (a stray's waits for
        # the node that answers for it)
        for attempt in runner.attempts.values():
            if attempt.origin is self and attempt.result is not None and not attempt.stray:
                link.outbox.put(attempt.result)
        self.link = link
        sides = [
            asyncio.create_task(link.outbox.run()),
            asyncio.create_task(self._heartbeat(link)),
            asyncio.create_task(self._read(link)),
            asyncio.create_task(self.stopping.wait()),
        ]
        try:
            done, _ = await asyncio.wait(sides, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.link = None
            if self.members and self.cluster is not None:
                # a cluster's node may be gone for good: its attempts are strays, and the
                # other nodes are asked at once (a single node's are reclaimed by a hello)
                self.runner.lost(self)
                for connection in self.cluster.connections:
                    connection.claim()
            link.outbox.closed = True
            for task in sides:
                task.cancel()
            await asyncio.gather(*sides, return_exceptions=True)

    async def _heartbeat(self, link: Link) -> None:
        await link.welcome.wait()  # it beats at once, and sets the interval
        while True:
            await asyncio.sleep(link.heartbeat_interval)
            self._beat(link)

    def _beat(self, link: Link) -> None:
        # the claim goes before the heartbeat, in the same frame: this node may be the one
        # that took a stray over, and it answers the claim first
        self.claim()
        beat = self.runner.beat(self)
        if beat is not None:
            link.outbox.put(beat)

    def claim(self) -> None:
        """Claim the Worker's strays on this connection, if its node is in a cluster (a
        single node needs no claim: a ``hello`` reclaims)."""
        link = self.link
        if link is None or not self.members:
            return
        strays = self.runner.strays()
        if strays:
            link.outbox.put(Claim(strays))

    async def _read(self, link: Link) -> None:
        while True:
            frame = await link.ws.receive()
            if frame.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                if frame.type == aiohttp.WSMsgType.CLOSE and frame.data == CLOSE_FORBIDDEN:
                    why = f"the server refused this Worker: {frame.extra or 'forbidden'}"
                    log.error(why, extra={"action": "worker.forbidden"})
                    raise AuthError(why)  # for good: connecting again cannot help
                link.ended = _ending(frame, link.ws)
                break
            # the whole frame decoded (and checked against the protocol) in one pass
            for message in frames.decode(frame.data):
                if isinstance(message, frames.Welcome):
                    self._welcomed(link, message)
                elif isinstance(message, frames.Members):
                    self._listed(message.members)
                else:
                    self.runner.on_message(message, self)

    def _welcomed(self, link: Link, welcome: frames.Welcome) -> None:
        # four beats per timeout: one lost or late beat does not fail an attempt
        timeout = welcome.heartbeat_timeout or float("inf")
        link.heartbeat_interval = min(self.config.heartbeat_interval, timeout / 4)
        self.resume = welcome.resume
        link.welcome.set()
        self.log.connected(link.address)
        self.runner.welcomed(welcome, self)
        self._listed(welcome.members)
        # at once, not a heartbeat later: a stray the hello reclaimed is taken by the
        # reply, and the result it kept goes out (the first beat may be due before then)
        self._beat(link)

    def _listed(self, members: list[str]) -> None:
        """The nodes this one says the Worker should be connected to."""
        self.members = [m.strip().rstrip("/") for m in members if m.strip()]
        if self.cluster is not None:
            self.cluster.changed()


def _ending(frame: aiohttp.WSMessage, ws: aiohttp.ClientWebSocketResponse) -> str:
    """How a connection ended, from the frame that ended it."""
    if frame.type == aiohttp.WSMsgType.CLOSE:
        reason = f": {frame.extra}" if frame.extra else ""
        return f"closed by the node ({frame.data}{reason})"
    error = ws.exception() or (frame.data if isinstance(frame.data, BaseException) else None)
    if error is not None:
        return str(error) or type(error).__name__
    return f"the connection closed (code {ws.close_code})"


class _Unreachable(Exception):
    """No WebSocket to this address now: try the next one after a backoff."""

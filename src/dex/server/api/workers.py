"""The Worker channel: one WebSocket per Worker connection, speaking the typed protocol of
``dex.wire.protocol`` (its docstring and ``docs/worker-protocol.md`` state the rules).

A raw ASGI endpoint (``Channel``): one in-order loop per connection reads the server's
ASGI messages itself, without Starlette's ``WebSocket`` wrapper or FastAPI's routing on
every frame (``bench/README.md`` has what that bought). The route is declared in FastAPI
too, so the app alone (tests, tracing) serves it the same way; ``HotRoutes`` sends the
upgrade straight here on a serving node.

Every frame is validated whole before any of it acts: a frame that does not fit the
protocol closes the connection with code 4400 and the problem as its reason, and
changes nothing. This module keeps the socket and the decoding: what each message does
to attempts, and every frame sent back, is ``dex.server.attempts``' (``Link.receive``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, FastAPI, Header, Request
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send

from dex.server.api import cluster, models, tenancy
from dex.server.api.auth import AGENTS_KEY, GUARDED
from dex.server.api.responses import ORJSONResponse
from dex.server.ha.node import Node
from dex.server.sessions import Sessions
from dex.wire.protocol import CLOSE_BAD_FRAME, CLOSE_FORBIDDEN, CLOSE_ID_IN_USE, CLOSE_NOT_READY
from dex.wire.worker_frames import (
    Delta,
    Hello,
    HelloAgain,
    WorkerMessage,
    decode_hello,
)
from dex.wire.worker_frames import decode as decode_frame

log = logging.getLogger("dex.workers")
router = APIRouter()


PATH = "/v1/workers/connect"


class Socket:
    """The ASGI messages of one accepted WebSocket as frames in and out."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def receive(self) -> bytes | str | None:
        """The next frame's data; None once the Worker is gone."""
        if self.closed:
            return None
        message = await self._receive()
        if message["type"] != "websocket.receive":  # websocket.disconnect
            self.closed = True
            return None
        data: bytes | str | None = message.get("bytes") or message.get("text")
        return b"" if data is None else data

    async def send(self, frame: bytes) -> None:
        if self.closed:
            return
        try:
            await self._send({"type": "websocket.send", "bytes": frame})
        except (OSError, RuntimeError):  # the connection is gone (uvicorn: ClientDisconnected)
            self.closed = True

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        # a WebSocket close reason is at most 123 bytes
        reason = reason.encode()[:120].decode(errors="ignore")
        try:
            await self._send({"type": "websocket.close", "code": code, "reason": reason})
        except (OSError, RuntimeError):
            pass


class BadFrame(Exception):
    """A frame that does not fit the protocol."""


HOLD_AT_MOST = 0.001
"""Seconds one Worker's channel may run frames before it lets the rest of the node run."""


_DIGITS_ONLY = bytes(ord("0") if chr(b) in "0123456789" else ord(" ") for b in range(256))
"""A table for ``bytes.translate`` that maps each digit to ``0`` and every other byte to
a space: a run of 19 digits becomes 19 zeros, found by a plain substring search."""
_NINETEEN_DIGITS = b"0" * 19
"""2**63 has 19 digits: a frame without such a run of digits holds no integer beyond 64
bits, and skips the walk that looks for one. (Translating and searching costs about a
tenth of a regular expression's ``\\d{19}`` search.)"""


def _hello(raw: bytes | str) -> Hello:
    """The ``hello`` that opens a frame (the connection's first), decoded strictly with the
    protocol's own type; the frame is ``_parse``'s too, for the rest."""
    if not raw:
        raise BadFrame("an empty frame")
    try:
        return decode_hello(raw)
    except msgspec.DecodeError as e:  # a ValidationError too
        raise BadFrame(str(e)) from None


def _parse(raw: bytes | str) -> list[WorkerMessage]:
    """A frame's messages, decoded in one pass by the protocol's frame types
    (``dex.wire.worker_frames``): a ``done``'s result stays JSON, validated once by
    the type its Step expects."""
    if not raw:
        raise BadFrame("an empty frame")
    try:
        messages = decode_frame(raw)
    except msgspec.DecodeError as e:  # a ValidationError too
        raise BadFrame(str(e)) from None
    _no_huge_integer(raw)
    return messages


def _no_huge_integer(raw: bytes | str) -> None:
    """Refuse a frame holding an integer beyond 64 bits: Python parses it, but it could be
    neither stored nor sent on, and would silence whoever it is sent to."""
    data = raw if isinstance(raw, bytes) else raw.encode()
    if _NINETEEN_DIGITS not in data.translate(_DIGITS_ONLY):
        return
    stack: list[Any] = [msgspec.json.decode(raw)]
    while stack:
        item = stack.pop()
        if isinstance(item, int):
            if not -(2**63) <= item < 2**64:
                raise BadFrame("an integer beyond 64 bits (JSON here carries -2**63 to 2**64-1)")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _joined(messages: list[WorkerMessage]) -> list[WorkerMessage]:
    """Consecutive deltas of one attempt in a frame as one: subscribers get one event for
    a burst of text, not one per token (a burst of thousands would outrun any buffer)."""
    if sum(isinstance(m, Delta) for m in messages) < 2:
        return messages
    joined: list[WorkerMessage] = []
    for m in messages:
        last = joined[-1] if joined else None
        if isinstance(m, Delta) and isinstance(last, Delta) and last.attempt_id == m.attempt_id:
            joined[-1] = Delta(attempt_id=m.attempt_id, text=last.text + m.text)
        else:
            joined.append(m)
    return joined


class Channel:
    """The raw ASGI endpoint of ``/v1/workers/connect`` inside the FastAPI app (which puts
    itself in ``scope``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope["app"], scope, receive, send)


router.routes.append(WebSocketRoute(PATH, Channel(), name="worker_channel"))


async def serve(app: FastAPI, scope: Scope, receive: Receive, send: Send) -> None:
    """One Worker connection, from the upgrade to the disconnect."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    ws = Socket(receive, send)
    sessions: Sessions = app.state.sessions
    frame = await ws.receive()
    if frame is None:
        log.info("a Worker left before its hello", extra={"action": "worker.left_before_hello"})
        return
    try:
        hello = _hello(frame)
        rest = _parse(frame)[1:]
        if any(isinstance(m, HelloAgain) for m in rest):
            raise BadFrame("hello is the first message only")
    except BadFrame as e:
        await ws.close(CLOSE_BAD_FRAME, f"bad hello: {e}")
        return
    allowed: frozenset[str] | None = scope.get(AGENTS_KEY)  # the worker token's scope
    outside = sorted(a.name for a in hello.agents if allowed is not None and a.name not in allowed)
    if outside:
        log.warning(
            "refused a Worker: its token may not serve %s",
            ", ".join(outside),
            extra={"action": "worker.forbidden", "worker_id": hello.worker_id},
        )
        await ws.close(CLOSE_FORBIDDEN, f"this worker token may not serve {', '.join(outside)}")
        return
    node: Node | None = app.state.node
    if node is None or node.role != "active":
        await ws.close(CLOSE_NOT_READY, f"not ready: {node.role if node else 'starting'}")
        return
    await sessions.register_agents(hello.agents)
    if hello.attempts:  # a reconnect: what it claims may be in a partition coming in
        await node.settled(sessions.dispatcher.reclaim_window)
    link = sessions.attempts.connect(hello, ws, ws.close, node.lease_valid)
    if link is None:
        await ws.close(CLOSE_ID_IN_USE, f"worker id {hello.worker_id!r} is connected already")
        return
    log.info(
        "worker connected",
        extra={
            "action": "worker.connected",
            "worker_id": link.worker_id,
            "reclaimed": link.held,
            "stopped": link.stopped,
            "handed_back": link.handed_back,
        },
    )
    refused: str | None = None
    try:
        clock = time.perf_counter
        busy = 0.0  # seconds spent on this connection's frames since it let the rest run
        start = clock()
        while True:
            for message in _joined(rest):
                link.receive(message)
            # receive() returns at once while frames are queued: a Worker that streams
            # thousands of deltas a second would hold the loop, starving every subscriber
            # (then dropped) and every other Worker. Let the rest run every millisecond
            # of frames (the time waiting for a frame is not counted: others ran then).
            busy += clock() - start
            if busy > HOLD_AT_MOST:
                await asyncio.sleep(0)
                busy = 0.0
            frame = await ws.receive()
            start = clock()
            if frame is None:
                break
            try:
                rest = _parse(frame)
                if any(isinstance(m, HelloAgain) for m in rest):
                    raise BadFrame("hello is the first message only")
            except BadFrame as e:
                log.warning(
                    "bad frame: %s",
                    e,
                    extra={"action": "worker.bad_frame", "worker_id": link.worker_id},
                )
                refused = f"bad frame: {e}"
                break
    finally:
        link.disconnect()
        log.info(
            "worker disconnected",
            extra={
                "action": "worker.disconnected",
                "worker_id": link.worker_id,
                "held": link.held,
            },
        )
    if refused is not None:
        # closed after the Worker is forgotten: one that sees the close and connects
        # again at once is not refused as still connected
        await ws.close(CLOSE_BAD_FRAME, refused)


@router.get(
    "/v1/workers",
    tags=["workers"],
    response_model=models.WorkerList,
    responses=models.errors(401, 403, 422, 429, 500, 503),
    dependencies=[*GUARDED, *tenancy.UNSCOPED],
)
async def list_workers(
    request: Request,
    x_dex_local: Annotated[
        Literal["1"] | None,
        Header(description="`1`: this node's Workers only (how nodes ask each other)."),
    ] = None,
) -> ORJSONResponse:
    """The connected Workers: their agents, tools, capacity and the attempts they run; in a
    cluster, those of every node, each with the node it is connected to."""
    return ORJSONResponse(await cluster.all_workers(request, local=x_dex_local == "1"))

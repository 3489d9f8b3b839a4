"""The Worker channel: one WebSocket per Worker connection, speaking the typed protocol of
``dex.wire.protocol`` (its docstring and ``docs/worker-protocol.md`` state the rules).

A raw ASGI endpoint (``Channel``): one in-order loop per connection reads the server's
ASGI messages itself, without Starlette's ``WebSocket`` wrapper or FastAPI's routing on
every frame (``bench/README.md`` has what that bought). The route is declared in FastAPI
too, so the app alone (tests, tracing) serves it the same way; ``HotRoutes`` sends the
upgrade straight here on a serving node.

Every frame is validated whole before any of it acts: a frame that does not fit the
protocol closes the connection with code 4400 and the problem as its reason, and
changes nothing. A message about an attempt this connection does not hold is refused
(``stop`` or ``ack ok: false``), logged and counted. Results commit in parallel, so
one group commit takes a whole frame's results.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import msgspec
import orjson
from fastapi import APIRouter, FastAPI, Request
from pydantic import ValidationError
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send

from dex.errors import DexError
from dex.server.api import models
from dex.server.api.auth import AGENTS_KEY, GUARDED
from dex.server.api.responses import ORJSONResponse
from dex.server.dispatch.dispatcher import Dispatcher, WorkerConn, WorkerIdInUse
from dex.server.ha.node import Node
from dex.server.sessions import Sessions
from dex.wire.protocol import CLOSE_BAD_FRAME, CLOSE_FORBIDDEN, CLOSE_ID_IN_USE, CLOSE_NOT_READY
from dex.wire.worker_frames import (
    Back,
    Delta,
    Done,
    Drain,
    Fail,
    Heartbeat,
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


class Outbox:
    """Collects messages and sends them as one frame per event-loop turn."""

    def __init__(self, ws: Socket, dispatcher: Dispatcher) -> None:
        self.ws = ws
        self.dispatcher = dispatcher
        self.pending: list[dict[str, Any]] = []
        self.ready = asyncio.Event()
        self.closed = False

    def put(self, message: dict[str, Any]) -> None:
        if not self.closed:
            self.pending.append(message)
            self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.pending = self.pending, []
            if batch:
                try:
                    frame = orjson.dumps(batch)
                except orjson.JSONEncodeError:
                    frame = _encodable(batch)
                self.dispatcher.bytes_sent += len(frame)
                await self.ws.send(frame)


def _encodable(batch: list[dict[str, Any]]) -> bytes:
    """The frame of ``batch`` without the messages JSON cannot carry, each one logged.

    The door keeps such values out (``_parse``); were one to get past it, dropping its
    message beats a writer that dies and leaves the connection silent for good."""
    parts = []
    for message in batch:
        try:
            parts.append(orjson.dumps(message))
        except orjson.JSONEncodeError as e:
            log.error(
                "dropped a message JSON cannot carry: %s",
                e,
                extra={
                    "action": "worker.message_unencodable",
                    "message_type": message.get("t"),
                    "attempt_id": message.get("attempt_id"),
                },
            )
    return b"[" + b",".join(parts) + b"]"


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
    dispatcher = sessions.dispatcher
    await sessions.register_agents(hello.agents)
    outbox = Outbox(ws, dispatcher)
    queues = set()
    for agent in hello.agents:
        queues.add(f"model:{agent.name}")
        queues.update(f"tool:{agent.name}/{tool.name}" for tool in agent.tools)
    worker = WorkerConn(
        id=hello.worker_id,
        queues=queues,
        capacity=hello.capacity,
        send=outbox.put,
        agents=[a.name for a in hello.agents],
        history_cache=hello.history_cache,
    )
    try:
        stop, unreceived = dispatcher.connect(worker, hello.attempts, hello.resume)
    except WorkerIdInUse:
        await ws.close(CLOSE_ID_IN_USE, f"worker id {hello.worker_id!r} is connected already")
        return

    def close(code: int, reason: str) -> None:
        outbox.closed = True
        dispatcher.spawn(ws.close(code, reason))

    worker.close = close
    for held in unreceived:
        dispatcher.spawn(sessions.hand_back_unreceived(held))
    outbox.put(
        {
            "t": "welcome",
            "worker_id": worker.id,
            "heartbeat_timeout": dispatcher.heartbeat_timeout,
            "reconnect_grace": dispatcher.reconnect_grace,
            "resume": worker.resume,
            "stop": stop,
        }
    )
    writer = asyncio.create_task(outbox.run())
    log.info(
        "worker connected",
        extra={
            "action": "worker.connected",
            "worker_id": worker.id,
            "reclaimed": len(worker.attempts),
            "stopped": len(stop),
            "handed_back": len(unreceived),
        },
    )
    refused: str | None = None
    try:
        clock = time.perf_counter
        busy = 0.0  # seconds spent on this connection's frames since it let the rest run
        start = clock()
        while True:
            for message in _joined(rest):
                _handle(node, sessions, worker, outbox, message)
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
                    extra={"action": "worker.bad_frame", "worker_id": worker.id},
                )
                refused = f"bad frame: {e}"
                break
    finally:
        outbox.closed = True
        dispatcher.disconnect(worker)
        writer.cancel()
        log.info(
            "worker disconnected",
            extra={
                "action": "worker.disconnected",
                "worker_id": worker.id,
                "held": len(worker.attempts),
            },
        )
    if refused is not None:
        # closed after the Worker is forgotten: one that sees the close and connects
        # again at once is not refused as still connected
        await ws.close(CLOSE_BAD_FRAME, refused)


def _handle(
    node: Node, sessions: Sessions, worker: WorkerConn, outbox: Outbox, message: WorkerMessage
) -> None:
    """Act on one message, in the order they came; a result's commit joins the next group
    commit and answers with an ``ack`` when it is done, without holding up the next
    message."""
    dispatcher = sessions.dispatcher
    if isinstance(message, Heartbeat):
        if not node.lease_valid():
            return  # not sure it still leads: no "ok" from a node that may be replaced
        status: dict[str, str] = {}
        for a in message.attempts:
            if dispatcher.heartbeat(worker, a):
                status[a] = "ok"
            else:
                status[a] = "stop"
                if a in dispatcher.held:  # another connection's: never extend it
                    dispatcher.refuse(worker, a, "hb")
        reply: dict[str, object] = {"t": "hb", "status": status}
        if message.seq is not None:
            reply["seq"] = message.seq
        outbox.put(reply)
        return
    if isinstance(message, Delta):
        held = dispatcher.owned(worker, message.attempt_id)
        if held is None:
            dispatcher.refuse(worker, message.attempt_id, "delta")
            return
        if not node.lease_valid():
            return  # a node that may be replaced publishes no text: its successor discards it
        dispatcher.heartbeat(worker, message.attempt_id)
        held.output += len(message.text)
        sessions.streams.publish(
            held.session_id,
            "model.delta",
            {"attempt_id": message.attempt_id, "step_id": held.step_id, "text": message.text},
        )
        return
    if isinstance(message, Drain):
        worker.draining = True
        return
    assert isinstance(message, Done | Fail | Back)
    attempt = message.attempt_id
    if dispatcher.owned(worker, attempt) is None:
        reason = dispatcher.refuse(worker, attempt, _RESULTS[type(message)])
        outbox.put({"t": "ack", "attempt_id": attempt, "ok": False, "error": reason})
        return
    try:
        if isinstance(message, Done):
            done = sessions.complete_soon(attempt, bytes(message.result))
        elif isinstance(message, Fail):
            done = sessions.fail_soon(attempt, message.error)
        else:
            if message.reason == "history":  # it lacks the prefix: send the whole view next
                held = dispatcher.held[attempt]
                worker.history_sent.pop(held.session_id, None)
            done = sessions.hand_back_soon(attempt)
    except Exception as e:
        _answer(attempt, outbox, worker.id, e)
        return
    done.add_done_callback(functools.partial(_acked, attempt, outbox, worker.id))


_RESULTS: dict[type, str] = {Done: "done", Fail: "fail", Back: "back"}
"""Each result message's ``t``, as refusals name it."""


def _acked(attempt: str, outbox: Outbox, worker_id: str, done: asyncio.Future[Any]) -> None:
    """Answer every result: committed (ok) or refused, never silence."""
    if done.cancelled():
        _answer(attempt, outbox, worker_id, asyncio.CancelledError())
    else:
        _answer(attempt, outbox, worker_id, done.exception())


def _answer(attempt: str, outbox: Outbox, worker_id: str, error: BaseException | None) -> None:
    if error is None:
        outbox.put({"t": "ack", "attempt_id": attempt, "ok": True})
    elif isinstance(error, DexError | ValidationError):
        outbox.put({"t": "ack", "attempt_id": attempt, "ok": False, "error": str(error)})
    else:
        log.error(
            "committing a result failed",
            exc_info=error,
            extra={"action": "worker.result_failed", "attempt_id": attempt, "worker_id": worker_id},
        )
        outbox.put(
            {
                "t": "ack",
                "attempt_id": attempt,
                "ok": False,
                "error": f"the server could not record this result: {type(error).__name__}",
            }
        )


@router.get(
    "/v1/workers",
    tags=["workers"],
    response_model=models.WorkerList,
    responses=models.errors(401, 403, 429, 500, 503),
    dependencies=GUARDED,
)
async def list_workers(request: Request) -> ORJSONResponse:
    """The Workers connected to this node: their agents, tools, capacity and the attempts
    they run."""
    sessions: Sessions = request.app.state.sessions
    return ORJSONResponse({"workers": sessions.workers_view()})

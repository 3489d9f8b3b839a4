"""The Worker channel: one WebSocket per Worker, each frame a JSON list of messages.

Worker -> server
    {"t": "hello", "worker_id", "agents": [AgentSpec], "capacity"}   first, once
    {"t": "hb", "attempts": [attempt_id]}        heartbeat; the reply says which still run
    {"t": "delta", "attempt_id", "text"}         model output while it streams
    {"t": "done", "attempt_id", "result"}        a ModelResponse or a ToolOutcome
    {"t": "fail", "attempt_id", "error"}         a RecoveryError
    {"t": "back", "attempt_id"}                  handed back, never started
    {"t": "drain"}                               hand me nothing new
Server -> Worker
    {"t": "welcome", "worker_id", "heartbeat_timeout"}  heartbeat well within it
    {"t": "step", ...Handout}                    the attempt is recorded before this is sent
    {"t": "hb", "status": {attempt_id: "ok" | "stop"}}
    {"t": "ack", "attempt_id", "ok", "error"?}   a result committed (ok) or refused
    {"t": "cancel", "attempt_id"}                stop running it
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from dex.errors import DexError
from dex.server.dispatch.dispatcher import WorkerConn
from dex.server.sessions import Sessions
from dex.wire import AgentSpec, RecoveryError
from dex.wire import Wire as _Wire

log = logging.getLogger("dex.workers")
router = APIRouter()


class Hello(_Wire):
    t: str
    worker_id: str
    agents: list[AgentSpec]
    capacity: int = 16


class Outbox:
    """Collects messages and sends them as one frame per event-loop turn."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
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
                await self.ws.send_bytes(orjson.dumps(batch))


@router.websocket("/v1/workers/connect")
async def worker_channel(ws: WebSocket) -> None:
    app = ws.app
    sessions: Sessions = app.state.sessions
    await ws.accept()
    try:
        first = orjson.loads(await ws.receive_bytes())
        hello = Hello.model_validate(first[0] if isinstance(first, list) else first)
    except (ValueError, ValidationError, IndexError, KeyError) as e:
        await ws.close(code=4400, reason=f"bad hello: {e}"[:120])
        return
    if not app.state.ready:
        await ws.close(code=4503, reason="not ready")
        return
    await sessions.register_agents(hello.agents)
    outbox = Outbox(ws)
    queues = set()
    for agent in hello.agents:
        queues.add(f"model:{agent.name}")
        queues.update(f"tool:{agent.name}/{tool.name}" for tool in agent.tools)
    worker = WorkerConn(id=hello.worker_id, queues=queues, capacity=hello.capacity, send=outbox.put)
    outbox.put(
        {
            "t": "welcome",
            "worker_id": worker.id,
            "heartbeat_timeout": sessions.dispatcher.heartbeat_timeout,
        }
    )
    writer = asyncio.create_task(outbox.run())
    dispatcher = sessions.dispatcher
    dispatcher.connect(worker)
    log.info("worker connected", extra={"action": "worker.connected", "worker_id": worker.id})
    tasks: set[asyncio.Task[None]] = set()
    try:
        while True:
            frame = await ws.receive()
            if frame["type"] == "websocket.disconnect":
                break
            raw = frame.get("bytes") or frame.get("text")
            if raw is None:
                continue
            try:
                for message in orjson.loads(raw):
                    task = _handle(sessions, worker, outbox, message)
                    if task is not None:
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                # A frame we cannot read: refuse it clearly instead of crashing the channel.
                log.warning(
                    "bad message", extra={"action": "worker.bad_message", "worker_id": worker.id}
                )
                await ws.close(code=4400, reason=f"bad message: {e!r}"[:120])
                break
    except WebSocketDisconnect:
        pass
    finally:
        outbox.closed = True
        dispatcher.disconnect(worker)
        writer.cancel()
        log.info(
            "worker disconnected", extra={"action": "worker.disconnected", "worker_id": worker.id}
        )


def _handle(
    sessions: Sessions, worker: WorkerConn, outbox: Outbox, message: dict[str, Any]
) -> asyncio.Task[None] | None:
    kind = message.get("t")
    dispatcher = sessions.dispatcher
    if kind == "hb":
        status = {a: ("ok" if dispatcher.heartbeat(a) else "stop") for a in message["attempts"]}
        outbox.put({"t": "hb", "status": status})
        return None
    if kind == "delta":
        held = dispatcher.held.get(message["attempt_id"])
        if held is not None:
            dispatcher.heartbeat(message["attempt_id"])
            text = str(message.get("text", ""))
            held.output += len(text)
            sessions.streams.publish(
                held.session_id,
                "model.delta",
                {"attempt_id": message["attempt_id"], "step_id": held.step_id, "text": text},
            )
        return None
    if kind == "drain":
        worker.draining = True
        return None
    attempt = message.get("attempt_id", "")
    if not isinstance(attempt, str):
        raise TypeError(f"attempt_id must be a string, not {attempt!r}")
    if kind == "done":
        result: Any = message.get("result")  # if missing, validation refuses it
        work = sessions.complete(attempt, result)
    elif kind == "fail":
        work = _fail(sessions, attempt, message.get("error"))
    elif kind == "back":
        work = sessions.hand_back(attempt)
    else:
        log.warning("unknown message", extra={"action": "worker.bad_message", "kind": kind})
        return None
    return asyncio.create_task(_acked(attempt, work, outbox))


async def _fail(sessions: Sessions, attempt: str, error: Any) -> None:
    await sessions.fail(attempt, RecoveryError.model_validate(error))


async def _acked(attempt: str, work: Any, outbox: Outbox) -> None:
    try:
        await work
    except (DexError, ValidationError) as e:
        outbox.put({"t": "ack", "attempt_id": attempt, "ok": False, "error": str(e)})
    else:
        outbox.put({"t": "ack", "attempt_id": attempt, "ok": True})

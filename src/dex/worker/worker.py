"""A stateless Worker: holds agent definitions in code and runs the Steps it is handed.

It keeps one WebSocket to the active node (see ``dex.server.api.workers`` for the
messages), reconnects by itself, heartbeats every attempt it holds, and keeps
each result until the server acknowledges it, sending it again after a
reconnect. A result the server refuses (its attempt was failed meanwhile) is
dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
import orjson
from pydantic import Field
from pydantic_core import to_jsonable_python
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from dex import _failpoints as failpoints
from dex import _loop
from dex._address import addresses
from dex._settings import Settings
from dex.agent import Agent
from dex.errors import AuthError, ToolError
from dex.models.base import Model, ModelRequest
from dex.tools import PENDING, Interrupt, ToolContext
from dex.wire import (
    ITEMS,
    AttemptProgress,
    Item,
    ModelResponse,
    RecoveryError,
    StepType,
    ToolOutcome,
)
from dex.wire import server_frames as frames
from dex.wire.protocol import CLOSE_FORBIDDEN
from dex.worker.connection_log import ConnectionLog
from dex.worker.history import HistoryCache

if TYPE_CHECKING:
    from dex.worker.tracing import AttemptTracing

log = logging.getLogger("dex.worker")
_NO_SPAN = contextlib.nullcontext()


class WorkerConfig(Settings):
    """A Worker's settings. ``dex worker`` fills them from its flags, the ``DEX_*``
    variables and ``--config dex.toml`` (the ``[worker]`` table), in that order."""

    table = "worker"

    address: str | None = Field(None, validation_alias="DEX_ADDRESS")
    """The server's address(es), comma-separated (``DEX_ADDRESS``), when the Worker is
    given none."""
    capacity: int = Field(16, ge=1, le=100_000, validation_alias="DEX_WORKER_CAPACITY")
    """How many attempts this Worker runs at once (``DEX_WORKER_CAPACITY``)."""
    heartbeat_interval: float = Field(1.0, gt=0, validation_alias="DEX_WORKER_HEARTBEAT_INTERVAL")
    drain_timeout: float = Field(30.0, ge=0, validation_alias="DEX_DRAIN_TIMEOUT")
    """On shutdown, how long running attempts may take to finish (``DEX_DRAIN_TIMEOUT``)."""
    reconnect_initial: float = Field(0.1, gt=0, validation_alias="DEX_WORKER_RECONNECT_INITIAL")
    """The first wait before reconnecting; it doubles (with jitter) up to ``reconnect_max``."""
    reconnect_max: float = Field(1.0, gt=0, validation_alias="DEX_WORKER_RECONNECT_MAX")
    """The longest wait between two tries to reach a server: a node that restarts (or a
    standby that takes over) gets this Worker back within about this long of serving."""
    connect_timeout: float = Field(3.0, gt=0, validation_alias="DEX_WORKER_CONNECT_TIMEOUT")
    """How long a connection's WebSocket upgrade may take before the next address is tried."""
    ping_interval: float = Field(2.0, gt=0, validation_alias="DEX_WORKER_PING_INTERVAL")
    """WebSocket pings: a node that stops answering them (hung, cut off) is left for the
    next address after half this long without a pong."""
    worker_id: str | None = Field(None, max_length=200, validation_alias="DEX_WORKER_ID")
    token: str | None = Field(None, validation_alias="DEX_WORKER_TOKEN", repr=False)
    """The worker token, when the server has auth on (default: ``DEX_WORKER_TOKEN``)."""
    tracing: bool = Field(False, validation_alias="DEX_TRACING")
    """OpenTelemetry spans of the attempts it runs, under the server's (``DEX_TRACING``;
    needs ``dex-runtime[otel]``)."""


@dataclass(eq=False)
class _Attempt:
    handout: frames.Step
    traceparent: str | None = None
    """The attempt's span on the server, when the server traces."""
    history: list[Item] = field(default_factory=list)
    """RunModel and CompactContext: the model's view, validated."""
    task: asyncio.Task[None] | None = None
    started: asyncio.Future[bool] | None = None
    start_seq: int | None = None
    """The ``seq`` of the heartbeat that asks to start it; only its timely answer counts."""
    start_sent: float = 0.0
    result: dict[str, Any] | None = None


@dataclass(eq=False)
class _Link:
    """One live connection."""

    ws: aiohttp.ClientWebSocketResponse
    address: str
    heartbeat_interval: float
    welcomed: bool = False
    """Whether the node answered hello: a standby closes the connection before that."""
    ended: str = "the connection closed"
    """How it ended, as the node or the network said."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, message: dict[str, Any]) -> None:
        last = self.pending[-1] if self.pending else None
        if (
            message["t"] == "delta"
            and last is not None
            and last["t"] == "delta"
            and last["attempt_id"] == message["attempt_id"]
        ):  # text that waits for the link joins the text before it: one event, not many
            last["text"] += message["text"]
            return
        self.pending.append(message)
        self.ready.set()


class Worker:
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
        self._tracing: AttemptTracing | None = None
        if self.config.tracing:
            from dex.worker.tracing import AttemptTracing  # only when tracing is on

            self._tracing = AttemptTracing(self.id, tracer_provider)
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self._attempts: dict[str, _Attempt] = {}
        self._none_held = asyncio.Event()
        self._none_held.set()
        """Set while this Worker holds no attempt: a drain waits on it for the last acks."""
        self._histories = HistoryCache()
        self._resume: str | None = None
        self._seq = itertools.count(1)
        self._start_window = 5.0
        """How soon a start acknowledgement must answer (half the heartbeat timeout)."""
        """The resume token of the last welcome: proves a reconnect is this process."""
        self._link: _Link | None = None
        self._connection = ConnectionLog(self.id, list(self.agents), self.config.capacity)
        self._stop_reason = "shutdown"
        """Why the Worker drains: ``shutdown`` (called in code), or a signal's name."""
        self._signalled: asyncio.Future[None] | None = None
        """The drain a signal started (kept: a task nobody holds may be collected)."""
        self._stopping = asyncio.Event()
        self._draining = False
        self._stopped = asyncio.Event()
        self._running = False

    # --- lifecycle ---------------------------------------------------------------------

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
            async with aiohttp.ClientSession() as http:
                await self._connect_loop(http)
        except Exception as e:
            self._connection.stopped("error", e)
            raise
        else:
            self._connection.stopped(self._stop_reason)
        finally:
            for model in self._models():
                try:
                    await model.aclose()
                except Exception:
                    log.exception("closing a model failed", extra={"action": "worker.close_model"})
            self._stopped.set()

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
            self._stopping.set()
        if self._running:
            await self._stopped.wait()

    async def _drain(self, timeout: float) -> None:
        log.info(
            "draining: taking no new Steps, finishing %d running attempts within %gs",
            len(self._attempts),
            timeout,
            extra={"action": "worker.draining", "running": len(self._attempts), "timeout": timeout},
        )
        link = self._link
        if link is not None:
            link.put({"t": "drain"})
        for attempt in list(self._attempts.values()):
            if attempt.started is not None and not attempt.started.done():
                attempt.started.set_result(False)  # hands it back
        tasks = [a.task for a in self._attempts.values() if a.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
        # wait (briefly) for the server to acknowledge what we sent
        if self._attempts and self._link is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_held.wait(), min(timeout, 5.0))

    # --- the connection ------------------------------------------------------------------

    async def _connect_loop(self, http: aiohttp.ClientSession) -> None:
        """Connect to the addresses in turn, with exponential backoff and full jitter
        between failed tries (tenacity), until ``shutdown()``. A connection that closes
        starts again from the shortest wait."""
        targets = itertools.cycle(self.addresses)
        while not self._stopping.is_set():
            base = ""
            retrying = AsyncRetrying(
                wait=wait_random_exponential(
                    multiplier=self.config.reconnect_initial, max=self.config.reconnect_max
                ),
                sleep=self._pause,
                stop=lambda _: self._stopping.is_set(),
                retry=retry_if_exception_type(_Unreachable),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        base = next(targets)
                        ws = await self._connect(http, base)
            except _Unreachable:
                return  # shutting down
            link = _Link(ws, base, self.config.heartbeat_interval)
            try:
                async with ws:
                    await self._serve(link)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                link.ended = str(e) or type(e).__name__
            if self._stopping.is_set():
                return
            if link.welcomed:
                self._connection.lost(base, link.ended)
            else:  # accepted, then closed before its welcome: a standby, say
                self._connection.failed(base, link.ended)
            # a node that accepts and closes at once (a standby) is not asked again at once
            await self._pause(self.config.reconnect_initial * random.uniform(0.5, 1.0))

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless ``shutdown()`` comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

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
            self._connection.failed(base, e)
            raise _Unreachable(base) from e
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self._connection.failed(base, str(e) or type(e).__name__)
            raise _Unreachable(base) from e

    async def _serve(self, link: _Link) -> None:
        link.put(
            {
                "t": "hello",
                "worker_id": self.id,
                "agents": [a.spec().model_dump(mode="json") for a in self.agents.values()],
                "capacity": self.config.capacity,
                # on a reconnect: re-claim what this process still holds
                "attempts": list(self._attempts),
                "resume": self._resume,
                "history_cache": self._histories.sessions,
            }
        )
        if self._draining:
            link.put({"t": "drain"})
        # results the last node never acknowledged: send them again
        for attempt in self._attempts.values():
            if attempt.result is not None:
                link.put(attempt.result)
        self._link = link
        sides = [
            asyncio.create_task(self._write(link)),
            asyncio.create_task(self._heartbeat(link)),
            asyncio.create_task(self._read(link)),
            asyncio.create_task(self._stopping.wait()),
        ]
        try:
            done, _ = await asyncio.wait(sides, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self._link = None
            for task in sides:
                task.cancel()
            await asyncio.gather(*sides, return_exceptions=True)

    async def _write(self, link: _Link) -> None:
        while True:
            await link.ready.wait()
            link.ready.clear()
            batch, link.pending = link.pending, []
            if batch:
                try:
                    frame = orjson.dumps(batch)
                except orjson.JSONEncodeError:
                    frame = self._encodable(batch)
                await link.ws.send_bytes(frame)
                if any(m["t"] == "done" for m in batch):
                    failpoints.hit("worker.after_send_result")

    def _encodable(self, batch: list[dict[str, Any]]) -> bytes:
        """The frame of ``batch``, where a result JSON cannot carry (an integer beyond 64
        bits) becomes the attempt's failure: its code ran, so the server decides, as for
        any exception, whether the call is retried or its outcome is unknown."""
        parts = []
        for message in batch:
            try:
                parts.append(orjson.dumps(message))
                continue
            except orjson.JSONEncodeError as e:
                problem = f"the result cannot be sent as JSON: {e}"
            attempt = self._attempts.get(message.get("attempt_id", ""))
            log.warning(
                "%s",
                problem,
                extra={
                    "action": "worker.result_unencodable",
                    "attempt_id": message.get("attempt_id"),
                },
            )
            if message["t"] == "done" and attempt is not None:
                attempt.result = _fail(attempt.handout, problem, retryable=True)
                parts.append(orjson.dumps(attempt.result))
        return b"[" + b",".join(parts) + b"]"

    async def _heartbeat(self, link: _Link) -> None:
        while True:
            await asyncio.sleep(link.heartbeat_interval)
            if self._attempts:
                link.put({"t": "hb", "attempts": list(self._attempts)})

    async def _read(self, link: _Link) -> None:
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
                self._on_message(link, message)

    def _send(self, message: dict[str, Any]) -> None:
        if self._link is not None:
            self._link.put(message)

    def _on_message(self, link: _Link, message: frames.ServerMessage) -> None:
        if isinstance(message, frames.Ack):
            acked = self._forget(message.attempt_id)
            if acked is not None and not message.ok:
                log.info(
                    "result refused: %s",
                    message.error,
                    extra={"action": "worker.result_refused", "attempt_id": message.attempt_id},
                )
        elif isinstance(message, frames.Step):
            self._on_step(message)
        elif isinstance(message, frames.HeartbeatReply):
            seq = message.seq
            for attempt_id, status in message.status.items():
                held = self._attempts.get(attempt_id)
                if held is None:
                    continue
                if held.started is not None and not held.started.done():
                    if status != "ok":
                        held.started.set_result(False)
                    elif (
                        seq is not None
                        and seq == held.start_seq
                        and time.monotonic() - held.start_sent <= self._start_window
                    ):
                        held.started.set_result(True)  # a timely answer to our own ask
                elif status != "ok" and held.result is None:
                    self._abandon(held, "the server no longer runs this attempt")
        elif isinstance(message, frames.Cancel):
            cancelled = self._attempts.get(message.attempt_id)
            if cancelled is not None and cancelled.result is None:
                self._abandon(cancelled, "cancelled by the server")
        elif isinstance(message, frames.Welcome):
            # four beats per timeout: one lost or late beat does not fail an attempt
            timeout = message.heartbeat_timeout or float("inf")
            link.heartbeat_interval = min(self.config.heartbeat_interval, timeout / 4)
            self._start_window = min(5.0, timeout / 2)
            self._resume = message.resume
            link.welcomed = True
            self._connection.connected(link.address)
            for attempt_id in message.stop:
                stopped = self._attempts.get(attempt_id)
                if stopped is not None:
                    self._abandon(stopped, "the server no longer runs this attempt")

    def _on_step(self, handout: frames.Step) -> None:
        if handout.attempt_id in self._attempts:
            return
        raw = handout.history
        handout.history = msgspec.UNSET  # the frame's buffer is not kept with the attempt
        attempt = _Attempt(handout, handout.traceparent)
        self._attempts[handout.attempt_id] = attempt
        self._none_held.clear()
        if raw is msgspec.UNSET:
            pass
        elif handout.step_type == StepType.RUN_MODEL:
            view = self._histories.view(handout.session_id, handout.history_base, raw)
            if view is None:  # we lack what it builds on: the server sends it whole
                attempt.result = {
                    "t": "back",
                    "attempt_id": handout.attempt_id,
                    "reason": "history",
                }
                self._send(attempt.result)
                return
            attempt.history = view
        else:  # CompactContext: the whole view, every time
            attempt.history = ITEMS.validate_json(bytes(raw))
        attempt.task = asyncio.create_task(self._run_attempt(attempt))

    def _forget(self, attempt_id: str) -> _Attempt | None:
        attempt = self._attempts.pop(attempt_id, None)
        if not self._attempts:
            self._none_held.set()
        return attempt

    def _abandon(self, attempt: _Attempt, why: str) -> None:
        log.info(
            why,
            extra={"action": "worker.attempt_abandoned", "attempt_id": attempt.handout.attempt_id},
        )
        self._forget(attempt.handout.attempt_id)
        if attempt.task is not None:
            attempt.task.cancel()

    # --- running one attempt ---------------------------------------------------------------

    async def _run_attempt(self, attempt: _Attempt) -> None:
        h = attempt.handout
        try:
            agent = self.agents.get(h.agent)
            if agent is None:
                raise ToolError(f"this Worker does not serve agent {h.agent!r}")
            with self._span(attempt, agent):
                if h.step_type == StepType.RUN_MODEL:
                    result = await self._run_model(agent, h, attempt.history)
                elif h.step_type == StepType.COMPACT_CONTEXT:
                    result = await self._compact(agent, h, attempt.history)
                else:
                    result = await self._run_tool(agent, attempt)
            if result is None:
                return
            failpoints.hit("worker.before_send_result")
            attempt.result = {"t": "done", "attempt_id": h.attempt_id, "result": result}
        except asyncio.CancelledError:
            raise
        except Interrupt as pause:  # ctx.ask or ctx.sleep: the call goes on later
            attempt.result = {
                "t": "done",
                "attempt_id": h.attempt_id,
                "result": pause.outcome.model_dump(mode="json"),
            }
        except ToolError as e:
            if h.step_type in (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT):
                attempt.result = _fail(h, str(e), retryable=False)
            else:
                outcome = (
                    ToolOutcome(status="checked", happened=None, error=e.message)
                    if h.step_type == StepType.CHECK_TOOL_CALL
                    else ToolOutcome(status="failed", error=e.message)
                )
                attempt.result = {
                    "t": "done",
                    "attempt_id": h.attempt_id,
                    "result": outcome.model_dump(mode="json"),
                }
        except Exception as e:
            log.warning(
                "%s attempt %d of %s failed: %s: %s",
                h.step_type.value,
                h.attempt,
                h.tool or h.agent,
                type(e).__name__,
                e,
                exc_info=True,
                extra={
                    "action": "worker.attempt_failed",
                    "session_id": h.session_id,
                    "step_id": h.step_id,
                    "attempt_id": h.attempt_id,
                    "agent": h.agent,
                    "tool": h.tool,
                    "call_id": h.call_id,
                    "worker_id": self.id,
                },
            )
            attempt.result = _fail(
                h, f"{type(e).__name__}: {e}", retryable=getattr(e, "retryable", True)
            )
        if attempt.result is not None:
            self._send(attempt.result)

    def _span(self, attempt: _Attempt, agent: Agent) -> AbstractContextManager[None]:
        if self._tracing is None:
            return _NO_SPAN
        return self._tracing.span(attempt.handout, attempt.traceparent, agent.model.spec())

    async def _run_model(
        self, agent: Agent, h: frames.Step, history: list[Item]
    ) -> dict[str, Any] | None:
        request = ModelRequest(
            session_id=h.session_id,
            agent=agent.name,
            instructions=agent.instructions,
            history=history,
            tools=[t.spec() for t in agent.tools],
            attempt=h.attempt,
        )
        response: ModelResponse | None = None
        failpoints.hit("worker.run_model.before_output")
        async for event in agent.model.stream(request):
            if isinstance(event, ModelResponse):
                response = event
            else:
                self._send({"t": "delta", "attempt_id": h.attempt_id, "text": event})
        if response is None:
            raise RuntimeError(f"model {agent.model.spec()} returned no response")
        for call in response.tool_calls:
            tool = agent.tool(call.name)
            if tool is not None and callable(tool.approval) and tool.needs_approval(call.arguments):
                response.approval_required.append(call.id)
        return response.model_dump(mode="json")

    async def _compact(self, agent: Agent, h: frames.Step, history: list[Item]) -> dict[str, Any]:
        request = ModelRequest(
            session_id=h.session_id,
            agent=agent.name,
            instructions=agent.instructions,
            history=history,
            tools=[],
            attempt=h.attempt,
        )
        failpoints.hit("worker.compact_context.running")
        summary = await agent.model.summarize(request)
        return summary.model_dump(mode="json")

    async def _run_tool(self, agent: Agent, attempt: _Attempt) -> dict[str, Any] | None:
        h = attempt.handout
        assert h.tool is not None and h.call_id is not None and h.idempotency_key is not None
        tool = agent.tool(h.tool)
        if tool is None:
            raise ToolError(f"this Worker's agent {agent.name!r} has no tool {h.tool!r}")
        arguments = tool.validate(h.arguments)  # invalid arguments: the body never runs
        failpoints.hit("worker.before_first_heartbeat")
        if h.needs_start_ack or self._draining:
            attempt.started = asyncio.get_running_loop().create_future()
            if self._draining:
                attempt.started.set_result(False)
            if not await self._start_acknowledged(attempt):
                if self._draining:
                    self._send({"t": "back", "attempt_id": h.attempt_id})
                    attempt.result = {"t": "back", "attempt_id": h.attempt_id}
                else:
                    log.info(
                        "the server no longer runs this attempt: not starting it",
                        extra={"action": "worker.start_refused", "attempt_id": h.attempt_id},
                    )
                    self._forget(h.attempt_id)
                return None
        ctx = ToolContext(
            session_id=h.session_id,
            call_id=h.call_id,
            tool=tool.name,
            idempotency_key=h.idempotency_key,
            attempt=h.attempt,
            _heartbeat=lambda: self._beat(h.attempt_id),
            answers=list(h.answers),
            sleeps_done=h.sleeps_done,
        )
        if h.step_type == StepType.POLL_TOOL_TASK:
            failpoints.hit("worker.poll_running")
            value = await tool.call_poll(ctx, h.task_handle)
            if value is PENDING:
                return dict(_PENDING)
        elif h.step_type == StepType.CHECK_TOOL_CALL:
            verdict = await tool.call_check(ctx, arguments)
            outcome = ToolOutcome(
                status="checked", happened=verdict.happened, result=verdict.result
            )
            return outcome.model_dump(mode="json")
        else:
            failpoints.hit("worker.tool_running")
            value = await tool.invoke(ctx, arguments)
        return succeeded(value)

    async def _start_acknowledged(self, attempt: _Attempt) -> bool:
        """Ask the node whether to start (a heartbeat with a ``seq`` of ours) until it
        answers in time: an ``ok`` that comes back later than ``_start_window`` (a node
        that paused, and may have lost its lease meanwhile) does not count."""
        started = attempt.started
        assert started is not None
        while not started.done():
            attempt.start_seq = next(self._seq)
            attempt.start_sent = time.monotonic()
            self._send(
                {"t": "hb", "attempts": [attempt.handout.attempt_id], "seq": attempt.start_seq}
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(started), self._start_window)
        return started.result()

    async def _beat(self, attempt_id: str) -> None:
        self._send({"t": "hb", "attempts": [attempt_id]})


_SUCCEEDED = ToolOutcome(status="succeeded").model_dump(mode="json")
_PENDING = ToolOutcome(status="pending").model_dump(mode="json")


def succeeded(value: Any) -> dict[str, Any]:
    """``ToolOutcome(status="succeeded", result=value).model_dump(mode="json")``, without
    building and dumping a model: the outcome of nearly every tool call, and a tenth of
    the cost. ``value`` goes through the same serializer that dump uses for ``Any``
    (a value it cannot serialize raises the same error, and the attempt fails)."""
    return {**_SUCCEEDED, "result": to_jsonable_python(value, by_alias=False, inf_nan_mode="null")}


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


def _fail(h: frames.Step, message: str, *, retryable: bool) -> dict[str, Any]:
    error = RecoveryError(
        message=message, attempt_progress=AttemptProgress.NOT_COMPLETED, retryable=retryable
    )
    return {"t": "fail", "attempt_id": h.attempt_id, "error": error.model_dump(mode="json")}

"""The Worker protocol: every frame that crosses the Worker WebSocket, as types.

A Worker holds one WebSocket to the active node (``/v1/workers/connect``). Each
WebSocket message (a *frame*) is a JSON list of messages, so both sides batch what
is ready into one send. Each message is an object whose ``t`` names its type.

Both sides use these types: the server validates every frame a Worker sends against
``WORKER_FRAME`` and closes the connection with code 4400 (and the problem as its
reason) on the first frame that does not fit; the Worker validates what the server
sends against ``SERVER_FRAME``. Each side decodes the frames it reads most with msgspec
structs that mirror these types (the server after the ``hello``,
``dex.wire.worker_frames``; the Worker, ``dex.wire.server_frames``); tests keep each
pair alike.
``docs/worker-protocol.md`` is generated from this module; an SDK in another language
is written from that page.

Ownership. An attempt belongs to the connection it was handed out on. A ``hb``,
``delta``, ``done``, ``fail`` or ``back`` about any other attempt changes nothing: a
heartbeat answers ``stop`` for it, a result gets ``ack`` with ``ok: false``.

Reconnecting. A Worker whose connection dropped reconnects with a ``hello`` that
names, in ``attempts``, every attempt it was handed and has not seen settled (by an
``ack``, a ``stop`` or a ``cancel``), and gives in ``resume`` the token of its last
``welcome``. Within the node's reconnect grace its attempts are bound to the new
connection; the ``welcome`` lists in ``stop`` the named attempts it does not hold any
more (the Worker stops them at once and drops their results). An attempt bound to this
Worker that the ``hello`` does not name was never received: it goes back to the queue
and uses no attempt. Without a valid ``resume`` (a new process), nothing is re-claimed
and the old connection's attempts fail when the grace ends.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from dex.wire import AgentSpec, Handout, RecoveryError, Wire

PROTOCOL_VERSION = 1

AttemptId = Annotated[str, Field(min_length=1, max_length=512)]
"""``{session_id}/{step_id}/{attempt number}``: opaque to a Worker."""

MAX_ATTEMPTS_PER_MESSAGE = 100_000


# --- Worker -> server ----------------------------------------------------------------


class Hello(Wire):
    """First message on a connection, and only there."""

    t: Literal["hello"]
    worker_id: str = Field(min_length=1, max_length=200)
    """Stable for the life of the Worker process; unique among connected Workers."""
    agents: list[AgentSpec] = Field(max_length=1000)
    """The agents this Worker serves: the server hands it Steps of these only."""
    capacity: int = Field(16, ge=1, le=100_000)
    """How many attempts it runs at once."""
    attempts: list[AttemptId] = Field(default_factory=list, max_length=MAX_ATTEMPTS_PER_MESSAGE)
    """On a reconnect: every attempt it holds (running, or with a result not yet acked)."""
    resume: str | None = Field(None, max_length=200)
    """On a reconnect: the ``resume`` token of the last ``welcome``."""
    history_cache: int = Field(0, ge=0, le=1_000_000)
    """How many sessions' history this Worker keeps between hand-outs (least recently
    handed out dropped first). With 0 every RunModel hand-out carries the whole history;
    otherwise only what this connection has not been sent (``step.history_base``)."""
    protocol: int = PROTOCOL_VERSION


class Heartbeat(Wire):
    """The attempts this Worker runs are alive. The reply (``hb``) says, per attempt,
    ``ok`` (go on) or ``stop``. For a single-attempt tool the first ``ok`` is the start
    acknowledgement: the tool body starts only after it."""

    t: Literal["hb"]
    attempts: list[AttemptId] = Field(max_length=MAX_ATTEMPTS_PER_MESSAGE)
    seq: int | None = None
    """Echoed in the reply, so a Worker can tell which heartbeat a reply answers (a start
    acknowledgement counts only as the answer to the heartbeat that asked for it, and
    only if it came back in time)."""


class Delta(Wire):
    """Model output of a RunModel attempt while it streams (also a heartbeat)."""

    t: Literal["delta"]
    attempt_id: AttemptId
    text: str


class Done(Wire):
    """The attempt's result: a ``ModelResponse`` (RunModel), a ``Summary``
    (CompactContext) or a ``ToolOutcome`` (tool Steps). Answered by an ``ack``."""

    t: Literal["done"]
    attempt_id: AttemptId
    result: dict[str, Any]


class Fail(Wire):
    """The attempt failed (an exception in the tool or model call). Answered by an
    ``ack``. ``error.retryable`` false fails the Step for good."""

    t: Literal["fail"]
    attempt_id: AttemptId
    error: RecoveryError


class Back(Wire):
    """The Worker hands back an attempt it never started: the Step queues again and the
    attempt is not counted. Answered by an ``ack``. ``reason: "history"``: the Worker does
    not have the history the hand-out builds on (``history_base``); the next hand-out of
    that session to this connection carries the whole history."""

    t: Literal["back"]
    attempt_id: AttemptId
    reason: Literal["history"] | None = None


class Drain(Wire):
    """Hand this Worker nothing new (it is stopping)."""

    t: Literal["drain"]


WorkerMessage = Annotated[
    Hello | Heartbeat | Delta | Done | Fail | Back | Drain, Field(discriminator="t")
]
WORKER_FRAME: TypeAdapter[list[WorkerMessage]] = TypeAdapter(list[WorkerMessage])


# --- server -> Worker ----------------------------------------------------------------


class Welcome(Wire):
    """The answer to ``hello``."""

    t: Literal["welcome"]
    worker_id: str
    heartbeat_timeout: float
    """Seconds without a heartbeat after which an attempt fails: beat well within it."""
    reconnect_grace: float
    """Seconds a dropped connection's attempts wait for the Worker to reconnect."""
    resume: str
    """Give it in the next ``hello`` to re-claim this connection's attempts."""
    stop: list[AttemptId] = Field(default_factory=list)
    """Attempts the ``hello`` named that this node does not run any more: stop them and
    drop their results."""


class StepMessage(Handout):
    """A Step attempt handed to this Worker. It is recorded durably before it is sent.

    RunModel and CompactContext carry the model's view of the history: the items from
    index ``history_base`` on. With ``history_base`` > 0 the Worker prepends the first
    ``history_base`` items of what it was handed last for this session (on this
    connection); a Worker that lacks them answers ``back`` with ``reason: "history"``."""

    t: Literal["step"]
    history_base: int = 0
    traceparent: str | None = Field(None, max_length=512)
    """With tracing on: the W3C ``traceparent`` of the attempt's span on the server. A
    Worker that traces makes its spans of the attempt children of it; others ignore it."""


class HeartbeatReply(Wire):
    """The answer to ``hb``. A node that cannot be sure it still leads (its lease may have
    run out) does not answer at all: no ``ok`` comes from a node that may have been
    replaced."""

    t: Literal["hb"]
    status: dict[str, Literal["ok", "stop"]]
    seq: int | None = None


class Ack(Wire):
    """A ``done``, ``fail`` or ``back`` was committed (``ok``) or refused (the attempt is
    not this connection's, not running any more, or the result does not fit its Step).
    Either way the Worker forgets the attempt."""

    t: Literal["ack"]
    attempt_id: str
    ok: bool
    error: str | None = None


class Cancel(Wire):
    """Stop running this attempt (its turn ended or was cancelled); no result is wanted."""

    t: Literal["cancel"]
    attempt_id: str


ServerMessage = Annotated[
    Welcome | StepMessage | HeartbeatReply | Ack | Cancel, Field(discriminator="t")
]
SERVER_FRAME: TypeAdapter[list[ServerMessage]] = TypeAdapter(list[ServerMessage])


# --- close codes -----------------------------------------------------------------------

CLOSE_BAD_FRAME = 4400
"""A frame that does not fit the protocol (the reason says where): fix the Worker."""
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
"""The hello names an agent this Worker's token may not serve (the reason names it): the
Worker stops, as for a refused token."""
CLOSE_ID_IN_USE = 4409
"""Another live connection uses this ``worker_id`` (reconnect later, or pick another)."""
CLOSE_NOT_READY = 4503
"""The node is starting, stopping or a standby: try the next address."""

__all__ = [
    "CLOSE_BAD_FRAME",
    "CLOSE_FORBIDDEN",
    "CLOSE_ID_IN_USE",
    "CLOSE_NOT_READY",
    "CLOSE_UNAUTHORIZED",
    "PROTOCOL_VERSION",
    "SERVER_FRAME",
    "WORKER_FRAME",
    "Ack",
    "Back",
    "Cancel",
    "Delta",
    "Done",
    "Drain",
    "Fail",
    "Heartbeat",
    "HeartbeatReply",
    "Hello",
    "ServerMessage",
    "StepMessage",
    "Welcome",
    "WorkerMessage",
]

"""The frames the server sends, as the protocol's one definition: the Worker reads them
with these structs, and ``docs/worker-protocol.md`` is generated from them
(``dex.wire.protocol_page``). ``dex.wire.protocol`` states the rules.

msgspec decodes a whole frame in one pass, strictly (a number sent as a string does not
fit), into objects whose attributes are plain slots: pydantic cost the Worker on both
ends, validating each message into a model, then reading the model's attributes (a
``BaseModel`` defines ``__getattr__``, so every attribute read takes Python's slow path).

A step's ``history`` stays raw JSON here: its items are pydantic models (the model API
takes them), validated by ``ITEMS`` when the Worker builds the model's view, and only
for RunModel and CompactContext.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from dex.wire import Item, StepType
from dex.wire.protocol import JSONOf

AttemptId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class _Message(msgspec.Struct, tag_field="t", forbid_unknown_fields=True):
    """The server writes its frames from these structs too (``dex.server.attempts``); a
    ``hb`` reply and an ``ack`` leave out a field at its default (``omit_defaults``), as
    the server always has."""


class Welcome(_Message, tag="welcome"):
    """The answer to ``hello``."""

    worker_id: str
    heartbeat_timeout: float
    """Seconds without a heartbeat after which an attempt fails: beat well within it."""
    reconnect_grace: float
    """Seconds a dropped connection's attempts wait for the Worker to reconnect."""
    resume: str
    """Give it in the next ``hello`` to re-claim this connection's attempts."""
    stop: list[AttemptId] = []
    """Attempts the ``hello`` named that this node does not run any more: stop them and
    drop their results. In a cluster only attempts of this node's own sessions are
    listed; one of another node's is left out (claim it there: ``claim``)."""
    members: list[str] = []
    """In a cluster: the base URLs (``http://10.0.0.2:7450``) of every node this Worker
    should be connected to, this one included; each node hands out only the Steps of its
    own sessions. Empty: a single node."""


class Step(_Message, tag="step"):
    """A Step attempt handed to this Worker. It is recorded durably before it is sent.

    RunModel and CompactContext carry the model's view of the history: the items from
    index ``history_base`` on. With ``history_base`` > 0 the Worker prepends the first
    ``history_base`` items of what it was handed last for this session (on this
    connection); a Worker that lacks them answers ``back`` with ``reason: "history"``."""

    attempt_id: str
    session_id: str
    step_id: str
    step_type: StepType
    attempt: int
    agent: str
    history: Annotated[msgspec.Raw, JSONOf(list[Item])] | msgspec.UnsetType = msgspec.UNSET
    """RunModel and CompactContext: the JSON of the items from ``history_base`` on (unset:
    none sent)."""
    tool: str | None = None
    call_id: str | None = None
    arguments: dict[str, Any] = {}
    idempotency_key: str | None = None
    needs_start_ack: bool = False
    answers: list[str] = []
    """Answers to the questions this call asked so far, in order."""
    sleeps_done: int = 0
    """How many of this call's ``ctx.sleep`` timers have fired."""
    task_handle: Any = None
    """For PollToolTask and CheckToolCall: what the task's start returned."""
    history_base: int = 0
    traceparent: Annotated[str, msgspec.Meta(max_length=512)] | None = None
    """With tracing on: the W3C ``traceparent`` of the attempt's span on the server. A
    Worker that traces makes its spans of the attempt children of it; others ignore it."""


class HeartbeatReply(_Message, tag="hb", omit_defaults=True):
    """The answer to ``hb``. A node that cannot be sure it still leads (its lease may have
    run out) does not answer at all: no ``ok`` comes from a node that may have been
    replaced."""

    status: dict[str, Literal["ok", "stop"]]
    """Per attempt: ``ok`` (go on) or ``stop``. In a cluster an attempt of a session this
    node does not own (or still recovers) is left out: claim it on the other connections
    (``claim``)."""
    seq: int | None = None


class Ack(_Message, tag="ack", omit_defaults=True):
    """A ``done``, ``fail`` or ``back`` was committed (``ok``) or refused (the attempt is
    not this connection's, not running any more, or the result does not fit its Step).
    Either way the Worker forgets the attempt."""

    attempt_id: str
    ok: bool
    error: str | None = None


class Cancel(_Message, tag="cancel"):
    """Stop running this attempt (its turn ended or was cancelled); no result is wanted."""

    attempt_id: str


class Members(_Message, tag="members"):
    """The cluster's nodes changed: connect to each of ``members`` you are not connected
    to yet (a node that joined); stop reconnecting to a node no connected node lists any
    more once its connection is down (a node that left). Sent to every connected Worker."""

    members: list[str]
    """As ``welcome.members``."""


class Claimed(_Message, tag="claimed"):
    """The answer to ``claim``, about the attempts of sessions this node owns and has
    recovered (the others are left out: ask again at the next heartbeat, their owner
    will answer)."""

    status: dict[str, Literal["ok", "stop"]]
    """Per attempt: ``ok``, it is this connection's now (heartbeat it here, send its
    result here); ``stop``, it runs nowhere any more (its reclaim window passed, or it
    is not this process's): stop it and drop its result."""


ServerMessage = Welcome | Step | HeartbeatReply | Ack | Cancel | Members | Claimed
MESSAGES: tuple[type[msgspec.Struct], ...] = (
    Welcome,
    Step,
    HeartbeatReply,
    Ack,
    Cancel,
    Members,
    Claimed,
)
"""Every message the server sends, in the page's order."""

_DECODER = msgspec.json.Decoder(list[ServerMessage])


def decode(frame: bytes | str) -> list[ServerMessage]:
    """The messages of one server frame; ``msgspec.ValidationError`` (a ``ValueError``)
    names the first thing that does not fit the protocol."""
    return _DECODER.decode(frame)

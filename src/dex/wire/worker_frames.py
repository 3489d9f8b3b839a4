"""The frames a Worker sends, as the protocol's one definition: the Python Worker writes
them from these structs, the server reads them with these structs, and
``docs/worker-protocol.md`` is generated from them (``dex.wire.protocol_page``).
``dex.wire.protocol`` states the rules.

Decoding is strict, whatever the frame: each field has the JSON type its schema gives,
as it is (a number or a boolean sent as a string, a boolean sent as a number, does not
fit). A frame is decoded in one pass; a ``done``'s result stays its raw JSON, validated
once, from JSON, by the type its Step expects (``Attempts.complete``). The agents
of a ``hello`` are payloads, validated (strictly) by their pydantic type ``AgentSpec``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ValidationError

from dex.wire import AgentSpec, AttemptProgress
from dex.wire.protocol import MAX_ATTEMPTS_PER_MESSAGE, PROTOCOL_VERSION, JSONOf

AttemptId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
"""``{session_id}/{step_id}/{attempt number}``: opaque to a Worker."""
AttemptIds = Annotated[list[AttemptId], msgspec.Meta(max_length=MAX_ATTEMPTS_PER_MESSAGE)]


class _Message(msgspec.Struct, tag_field="t", forbid_unknown_fields=True, omit_defaults=True):
    pass


class Hello(_Message, tag="hello"):
    """First message on a connection, and only there."""

    worker_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    """Stable for the life of the Worker process; unique among connected Workers."""
    agents: Annotated[list[AgentSpec], msgspec.Meta(max_length=1000)]
    """The agents this Worker serves: the server hands it Steps of these only."""
    capacity: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 16
    """How many attempts it runs at once."""
    attempts: AttemptIds = []
    """On a reconnect: every attempt it holds (running, or with a result not yet acked)."""
    resume: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    """On a reconnect: the ``resume`` token of the last ``welcome``."""
    history_cache: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    """How many sessions' history this Worker keeps between hand-outs (least recently
    handed out dropped first). With 0 every RunModel hand-out carries the whole history;
    otherwise only what this connection has not been sent (``step.history_base``)."""
    protocol: int = PROTOCOL_VERSION


class Heartbeat(_Message, tag="hb"):
    """The attempts this Worker runs are alive. The reply (``hb``) says, per attempt,
    ``ok`` (go on) or ``stop``. For a single-attempt tool the first ``ok`` is the start
    acknowledgement: the tool body starts only after it."""

    attempts: AttemptIds
    seq: int | None = None
    """Echoed in the reply, so a Worker can tell which heartbeat a reply answers (a start
    acknowledgement counts only as the answer to the heartbeat that asked for it, and
    only if it came back in time)."""


class Delta(_Message, tag="delta"):
    """Model output of a RunModel attempt while it streams (also a heartbeat)."""

    attempt_id: AttemptId
    text: str


class Done(_Message, tag="done"):
    """The attempt's result: a ``ModelResponse`` (RunModel), a ``Summary``
    (CompactContext) or a ``ToolOutcome`` (tool Steps). Answered by an ``ack``."""

    attempt_id: AttemptId
    result: Annotated[msgspec.Raw, JSONOf(dict[str, Any])]
    """The result's JSON: an object (``decode`` refuses any other value)."""


class RecoveryError(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Why an attempt failed, and how far it got."""

    message: str
    attempt_progress: AttemptProgress = AttemptProgress.UNSPECIFIED
    retryable: bool = True


class Fail(_Message, tag="fail"):
    """The attempt failed (an exception in the tool or model call). Answered by an
    ``ack``. ``error.retryable`` false fails the Step for good."""

    attempt_id: AttemptId
    error: RecoveryError


class Back(_Message, tag="back"):
    """The Worker hands back an attempt it never started: the Step queues again and the
    attempt is not counted. Answered by an ``ack``. ``reason: "history"``: the Worker does
    not have the history the hand-out builds on (``history_base``); the next hand-out of
    that session to this connection carries the whole history. ``reason:
    "rate_limited"``: the model provider refused the call for its rate limit or its load
    (nothing ran); the Step is handed out again after ``retry_after`` seconds, or after a
    backoff that doubles with each refusal in a row (1 s to 60 s)."""

    attempt_id: AttemptId
    reason: Literal["history", "rate_limited"] | None = None
    retry_after: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    """With ``rate_limited``: the provider's ``Retry-After``, in seconds."""


class Drain(_Message, tag="drain"):
    """Hand this Worker nothing new (it is stopping)."""


class Claim(_Message, tag="claim"):
    """In a cluster: attempts this Worker still runs (or holds the result of) that were
    handed out on its connection to another node, which is gone or no longer runs them
    (its connection dropped, or its heartbeat reply left them out). Sent on every
    connection, before its heartbeat, until a node answers (``claimed``): the node that
    took their sessions over binds each to this connection if the token proves that this
    is the process it was handed to (``Dispatcher.await_reclaim``)."""

    attempts: Annotated[
        dict[AttemptId, Annotated[str, msgspec.Meta(max_length=200)]],
        msgspec.Meta(max_length=MAX_ATTEMPTS_PER_MESSAGE),
    ]
    """Each attempt, with the ``resume`` token of the welcome of the connection it was
    handed out on."""


class HelloAgain(msgspec.Struct, tag_field="t", tag="hello"):
    """A ``hello`` after the first message: refused whatever it holds."""


WorkerMessage = Heartbeat | Delta | Done | Fail | Back | Drain | Claim | HelloAgain
"""What a frame after the ``hello`` may hold (a ``HelloAgain`` is refused by the server)."""
MESSAGES: tuple[type[msgspec.Struct], ...] = (
    Hello,
    Heartbeat,
    Delta,
    Done,
    Fail,
    Back,
    Drain,
    Claim,
)
"""Every message a Worker sends, in the page's order."""


def _payload(kind: type, value: Any) -> Any:
    """A payload inside a frame (a ``hello``'s agents), validated strictly by its pydantic
    type, from JSON as the frame came (in strict mode only JSON gives an enum its value)."""
    if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
        raise NotImplementedError(kind)
    try:
        return kind.model_validate_json(msgspec.json.encode(value), strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None


_DECODER = msgspec.json.Decoder(list[WorkerMessage])
_FIRST_DECODER = msgspec.json.Decoder(
    list[Hello | Heartbeat | Delta | Done | Fail | Back | Drain | Claim], dec_hook=_payload
)


def decode(frame: bytes | str) -> list[WorkerMessage]:
    """The messages of one frame after the ``hello``; ``msgspec.ValidationError`` (a
    ``ValueError``) names the first thing that does not fit the protocol."""
    messages = _DECODER.decode(frame)
    _results_are_objects(messages)
    return messages


def decode_hello(frame: bytes | str) -> Hello:
    """The ``hello`` that opens a connection's first frame, the whole frame checked;
    ``msgspec.ValidationError`` names the first thing that does not fit."""
    messages = _FIRST_DECODER.decode(frame)
    if not messages or type(messages[0]) is not Hello:
        raise msgspec.ValidationError("the first message must be a hello")
    _results_are_objects(messages)
    return messages[0]


def _results_are_objects(messages: list[Any]) -> None:
    for i, m in enumerate(messages):
        if type(m) is Done and memoryview(m.result)[:1].tobytes() != b"{":
            raise msgspec.ValidationError(f"Expected `object` - at `$[{i}].result`")

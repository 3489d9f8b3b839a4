"""The server's frames as the server writes them and the Worker reads them: msgspec
structs mirroring ``SERVER_FRAME``.

The protocol's types are the pydantic models of ``dex.wire.protocol``: the server
validates what Workers send with them, and ``docs/worker-protocol.md`` is generated
from them. The Worker reads several server frames per turn, and pydantic cost it on
both ends: validating each message into a model, then reading the model's attributes
(a ``BaseModel`` defines ``__getattr__``, so every attribute read takes Python's slow
path). These structs decode a whole frame in one pass, with the same fields, types,
defaults and bounds, into objects whose attributes are plain slots;
``tests/unit/test_server_frames.py`` checks that they accept and refuse what
``SERVER_FRAME`` does, so the two cannot drift apart unnoticed.

A step's ``history`` stays raw JSON here: its items are pydantic models (the model API
takes them), validated by ``ITEMS`` when the Worker builds the model's view, and only
for RunModel and CompactContext.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from dex.wire import StepType

AttemptId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class _Message(msgspec.Struct, tag_field="t", forbid_unknown_fields=True):
    """The server writes its frames from these structs too (``dex.server.attempts``); a
    ``hb`` reply and an ``ack`` leave out a field at its default (``omit_defaults``), as
    the server always has."""


class Welcome(_Message, tag="welcome"):
    worker_id: str
    heartbeat_timeout: float
    reconnect_grace: float
    resume: str
    stop: list[AttemptId] = []


class Step(_Message, tag="step"):
    """``StepMessage``: a Step attempt handed to this Worker."""

    attempt_id: str
    session_id: str
    step_id: str
    step_type: StepType
    attempt: int
    agent: str
    history: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """The JSON of the items from ``history_base`` on (unset: none sent)."""
    tool: str | None = None
    call_id: str | None = None
    arguments: dict[str, Any] = {}
    idempotency_key: str | None = None
    needs_start_ack: bool = False
    answers: list[str] = []
    sleeps_done: int = 0
    task_handle: Any = None
    history_base: int = 0
    traceparent: Annotated[str, msgspec.Meta(max_length=512)] | None = None


class HeartbeatReply(_Message, tag="hb", omit_defaults=True):
    status: dict[str, Literal["ok", "stop"]]
    seq: int | None = None


class Ack(_Message, tag="ack", omit_defaults=True):
    attempt_id: str
    ok: bool
    error: str | None = None


class Cancel(_Message, tag="cancel"):
    attempt_id: str


ServerMessage = Welcome | Step | HeartbeatReply | Ack | Cancel

_DECODER = msgspec.json.Decoder(list[ServerMessage])


def decode(frame: bytes | str) -> list[ServerMessage]:
    """The messages of one server frame; ``msgspec.ValidationError`` (a ``ValueError``)
    names the first thing that does not fit the protocol."""
    return _DECODER.decode(frame)

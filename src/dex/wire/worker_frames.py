"""The Workers' frames as the server reads them after the ``hello``: msgspec structs
mirroring ``WORKER_FRAME``.

The protocol's types are the pydantic models of ``dex.wire.protocol`` (the protocol's page
is generated from them, and the server reads each connection's first frame, its
``hello``, with them). Every later frame carries results, heartbeats and deltas, and
pydantic cost the server twice on each result: the frame parsed into plain values, then
those values validated again into the Step's own type. These structs decode a frame in
one pass, with the same fields, types, defaults and bounds, and keep a ``done``'s result
as its raw JSON, validated once, from JSON, by the type its Step expects
(``Attempts.complete``). ``tests/unit/test_worker_frames.py`` checks that they accept
and refuse what ``WORKER_FRAME`` does, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from dex.wire import AttemptProgress
from dex.wire.protocol import MAX_ATTEMPTS_PER_MESSAGE

AttemptId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class _Message(msgspec.Struct, tag_field="t", forbid_unknown_fields=True):
    pass


class Heartbeat(_Message, tag="hb"):
    attempts: Annotated[list[AttemptId], msgspec.Meta(max_length=MAX_ATTEMPTS_PER_MESSAGE)]
    seq: int | None = None


class Delta(_Message, tag="delta"):
    attempt_id: AttemptId
    text: str


class Done(_Message, tag="done"):
    attempt_id: AttemptId
    result: msgspec.Raw
    """The result's JSON: an object (``decode`` refuses any other value)."""


class RecoveryError(msgspec.Struct, forbid_unknown_fields=True):
    message: str
    attempt_progress: AttemptProgress = AttemptProgress.UNSPECIFIED
    retryable: bool = True


class Fail(_Message, tag="fail"):
    attempt_id: AttemptId
    error: RecoveryError


class Back(_Message, tag="back"):
    attempt_id: AttemptId
    reason: Literal["history"] | None = None


class Drain(_Message, tag="drain"):
    pass


class Hello(msgspec.Struct, tag_field="t", tag="hello"):
    """A ``hello`` after the first frame: refused whatever it holds."""


WorkerMessage = Heartbeat | Delta | Done | Fail | Back | Drain | Hello

_DECODER = msgspec.json.Decoder(list[WorkerMessage])


def decode(frame: bytes | str) -> list[WorkerMessage]:
    """The messages of one frame after the ``hello``; ``msgspec.ValidationError`` (a
    ``ValueError``) names the first thing that does not fit the protocol."""
    messages = _DECODER.decode(frame)
    for i, m in enumerate(messages):
        if type(m) is Done and memoryview(m.result)[:1].tobytes() != b"{":
            raise msgspec.ValidationError(f"Expected `object` - at `$[{i}].result`")
    return messages

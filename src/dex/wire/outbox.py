"""The batching outbox of the Worker WebSocket, on either side of it.

Each side puts messages (the frame structs of ``dex.wire.worker_frames`` or
``dex.wire.server_frames``) as they come; a writer task sends whatever waits as one frame
(a JSON array) each time it gets to run, so a burst of messages costs one send. The text
of an attempt's ``delta`` that waits joins the text of the ``delta`` before it, when that
one is the same attempt's (the protocol's rule 2): one event, not one per token.
"""

from __future__ import annotations

import logging
from asyncio import Event
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import msgspec
from pydantic import BaseModel

from dex.wire.integers import beyond_64_bits
from dex.wire.worker_frames import Delta

log = logging.getLogger("dex.wire")

M = TypeVar("M")


def _plain(value: Any) -> Any:
    """A payload inside a frame (a ``hello``'s agents) as JSON values."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise NotImplementedError(f"{type(value).__name__} is not part of a frame")


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)


def encode(messages: list[Any]) -> bytes:
    """One frame of ``messages`` (frame structs)."""
    return _ENCODER.encode(messages)


def _dropped(message: Any, error: Exception) -> None:
    config = getattr(message, "__struct_config__", None)
    log.error(
        "dropped a message JSON cannot carry: %s",
        error,
        extra={
            "action": "worker.message_unencodable",
            "message_type": config.tag if config is not None else type(message).__name__,
            "attempt_id": getattr(message, "attempt_id", None),
        },
    )


class Outbox(Generic[M]):
    """Messages waiting for the connection, sent as one frame per turn of the writer.

    ``send`` gets each frame and the messages it holds. A message that cannot be encoded
    is left out of its frame and passed to ``unencodable``: a writer that died would leave
    the connection silent for good."""

    def __init__(
        self,
        send: Callable[[bytes, list[M]], Awaitable[object]],
        unencodable: Callable[[M, Exception], object] = _dropped,
    ) -> None:
        self._send = send
        self._unencodable = unencodable
        self.pending: list[M] = []
        self.ready = Event()
        self.closed = False
        """Set once the connection is gone: what is put then is dropped."""

    def put(self, message: M) -> None:
        if self.closed:
            return
        if isinstance(message, Delta) and self.pending:
            last = self.pending[-1]
            if isinstance(last, Delta) and last.attempt_id == message.attempt_id:
                last.text += message.text
                return
        self.pending.append(message)
        self.ready.set()

    async def run(self) -> None:
        """Send until cancelled."""
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.pending = self.pending, []
            if batch:
                await self._send(self.encode(batch), batch)

    def encode(self, batch: list[M]) -> bytes:
        """The frame of ``batch``, without the messages JSON cannot carry (here: an
        integer beyond 64 bits too, which msgspec would write)."""
        try:
            frame = encode(batch)
            if not beyond_64_bits(frame):
                return frame
        except _UNENCODABLE:
            pass
        parts = []
        for message in batch:
            try:
                part = encode([message])
                if beyond_64_bits(part):
                    raise OverflowError(
                        "an integer beyond 64 bits (JSON here carries -2**63 to 2**64-1)"
                    )
                parts.append(part[1:-1])
            except _UNENCODABLE as e:
                self._unencodable(message, e)
        return b"[" + b",".join(parts) + b"]"


_UNENCODABLE = (TypeError, ValueError, OverflowError, NotImplementedError)

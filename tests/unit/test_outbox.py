"""The batching outbox of the Worker WebSocket (``dex.wire.outbox``): what waits leaves as
one frame, in order, and a message that cannot be encoded is left out, not the frame."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sized

import orjson
import pytest

from dex.testing import wait_until_async
from dex.wire.outbox import Outbox
from dex.wire.worker_frames import Delta, Drain, Heartbeat, WorkerMessage


async def _sent(frames: Sized, count: int) -> None:
    async def enough() -> bool:
        return len(frames) >= count

    await wait_until_async(enough, 5, what=f"{count} frames sent")


async def test_what_waits_leaves_as_one_frame_in_order() -> None:
    frames: list[tuple[bytes, list[WorkerMessage]]] = []

    async def send(frame: bytes, batch: list[WorkerMessage]) -> None:
        frames.append((frame, batch))

    outbox: Outbox[WorkerMessage] = Outbox(send)
    outbox.put(Heartbeat(attempts=["s/1/1"], seq=1))
    outbox.put(Delta(attempt_id="s/1/1", text="hi"))
    outbox.put(Drain())
    writer = asyncio.create_task(outbox.run())
    await _sent(frames, 1)
    outbox.put(Heartbeat(attempts=[]))
    await _sent(frames, 2)
    writer.cancel()
    assert [orjson.loads(frame) for frame, _ in frames] == [
        [
            {"t": "hb", "attempts": ["s/1/1"], "seq": 1},
            {"t": "delta", "attempt_id": "s/1/1", "text": "hi"},
            {"t": "drain"},
        ],
        [{"t": "hb", "attempts": []}],
    ]
    outbox.closed = True
    outbox.put(Drain())
    assert outbox.pending == []


async def test_a_message_that_cannot_be_encoded_is_dropped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[bytes] = []

    async def send(frame: bytes, batch: list[WorkerMessage]) -> None:
        sent.append(frame)

    outbox: Outbox[WorkerMessage] = Outbox(send)
    outbox.put(Delta(attempt_id="s/1/1", text="before"))
    outbox.put(Delta(attempt_id="s/2/1", text=object()))  # type: ignore[arg-type]
    outbox.put(Drain())
    writer = asyncio.create_task(outbox.run())
    await _sent(sent, 1)
    writer.cancel()
    assert orjson.loads(sent[0]) == [
        {"t": "delta", "attempt_id": "s/1/1", "text": "before"},
        {"t": "drain"},
    ]
    (dropped,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert dropped.__dict__["action"] == "worker.message_unencodable"
    assert (dropped.__dict__["message_type"], dropped.__dict__["attempt_id"]) == ("delta", "s/2/1")


async def test_a_message_with_an_integer_beyond_64_bits_is_dropped_not_sent() -> None:
    """msgspec writes such an integer; the other side may not read it (JavaScript, Go)."""
    sent: list[bytes] = []

    async def send(frame: bytes, batch: list[WorkerMessage]) -> None:
        sent.append(frame)

    outbox: Outbox[WorkerMessage] = Outbox(send)
    outbox.put(Heartbeat(attempts=[], seq=2**70))
    outbox.put(Heartbeat(attempts=[], seq=2**64 - 1))
    outbox.put(Heartbeat(attempts=[], seq=-(2**63) - 1))
    writer = asyncio.create_task(outbox.run())
    await _sent(sent, 1)
    writer.cancel()
    assert orjson.loads(sent[0]) == [{"t": "hb", "attempts": [], "seq": 2**64 - 1}]

"""Streaming a session's events to a client (Server-Sent Events), with resume."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from typing import Any

import pytest

import dex
from dex.testing import wait_until
from tests.support.rig import Rig, metric


def order(event_id: str) -> tuple[int, ...]:
    """Where an id falls in its stream ("57", or a Redis stream id "1733150000000-3")."""
    return tuple(int(part) for part in event_id.split("-"))


async def collect(
    client: dex.Client, sid: str, until: str, after: str | None = None
) -> list[dict[str, Any]]:
    events = []
    async for event in client.stream_events(sid, last_event_id=after):
        events.append(event)
        if event["type"] == until:
            return events
    raise AssertionError("the stream ended early")


def test_a_client_streams_model_output_and_lifecycle_and_resumes(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("streamer")  # streams 4 characters every 10 ms
    text = "stream me please " * 5

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with dex.Client(rig.server.address) as client:
            # a subscriber gets the buffered events first, so the order does not matter
            await client.send_message(sid, text)
            live = await asyncio.wait_for(collect(client, sid, "turn.completed"), 30)
            resumed = await asyncio.wait_for(
                collect(client, sid, "turn.completed", after=live[1]["id"]), 30
            )
            return live, resumed

    live, resumed = asyncio.run(scenario())
    types = [e["type"] for e in live]
    assert "turn.started" in types and types[-1] == "turn.completed"
    deltas = "".join(e["data"]["text"] for e in live if e["type"] == "model.delta")
    assert deltas == f"echo: {text}"  # the live output, as the model streamed it
    items = [e["data"]["item"]["type"] for e in live if e["type"] == "history.item"]
    assert items == ["user", "assistant"]
    assert all(isinstance(e["id"], str) for e in live)
    assert [e["id"] for e in live] == sorted((e["id"] for e in live), key=order)
    assert [e["id"] for e in resumed] == [e["id"] for e in live[2:]]  # resume after id


def test_streaming_an_unknown_session_is_a_404(rig: Rig) -> None:
    rig.start_server()

    async def scenario() -> None:
        async with dex.Client(rig.server.address) as client:
            with pytest.raises(dex.NotFound):
                await collect(client, "nope", "turn.completed")

    asyncio.run(scenario())


class Follower:
    """``stream_events`` on its own event loop thread, keeping what it yields."""

    def __init__(self, address: str, sid: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._reading = asyncio.run_coroutine_threadsafe(self._read(address, sid), self._loop)

    async def _read(self, address: str, sid: str) -> None:
        async with dex.Client(address, timeout=30) as client:
            async for event in client.stream_events(sid):
                self.events.append(event)

    def saw(self, kind: str, **data: Any) -> bool:
        if self._reading.done():
            self._reading.result()  # raises what ended it
            raise AssertionError("the stream ended")
        return any(
            e["type"] == kind and all(e["data"].get(k) == v for k, v in data.items())
            for e in list(self.events)
        )

    @staticmethod
    async def _cancel_the_rest() -> None:
        """Cancel the reader and wait until it has closed its client (its sockets)."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cancel_the_rest(), self._loop).result(10)
        with contextlib.suppress(concurrent.futures.CancelledError):
            self._reading.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def test_a_client_streams_on_through_a_server_restart(rig: Rig) -> None:
    """The client reconnects by itself: the events of a turn sent after a SIGKILL and
    restart reach the same ``stream_events`` loop, each once."""
    rig.start_server()
    rig.start_worker()
    sid = rig.session("streamer")
    follower = Follower(rig.server.address, sid)
    try:
        rig.client.send_message(sid, "stream me please " * 5)
        wait_until(lambda: follower.saw("turn.completed", turn=1), 30, what="turn 1 streamed")
        before = len(follower.events)
        rig.restart_server()
        rig.wait_turn(sid, rig.client.send_message(sid, "after")["turn"])
        wait_until(lambda: follower.saw("turn.completed", turn=2), 30, what="turn 2 streamed")
    finally:
        follower.close()
    after = follower.events[before:]
    # the restarted node kept nothing from before (in-memory streams): it says so first,
    # whenever the client came back, and then sends all it has
    assert after[0]["type"] == "stream.gap" and after[0]["id"] == follower.events[before - 1]["id"]
    assert [e["data"]["index"] for e in follower.events if e["type"] == "history.item"] == [
        0,
        1,
        2,
        3,
    ]
    assert "".join(e["data"]["text"] for e in after if e["type"] == "model.delta") == "echo: after"
    assert [e["type"] for e in after if e["type"].startswith("turn.")] == [
        "turn.started",
        "turn.completed",
    ]


def test_a_stalled_subscriber_slows_no_one_and_is_dropped_with_a_notice(rig: Rig) -> None:
    """A subscriber that stops reading holds only its own socket's buffers: the turn and
    a reading subscriber go on at full speed, and when the stalled one reads again it finds
    ``stream.dropped`` after what its socket held, and the response closed."""
    rig.start_server()
    rig.start_worker()
    sid = rig.session("flood")  # 12,000 deltas of 500 characters, as fast as it can
    size = 6_000_000  # more than the sockets between the server and the stalled one hold
    host, port = rig.server.address.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    stalled.sendall(f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: dex\r\n\r\n".encode())
    try:
        wait_until(lambda: metric(rig, "dex_stream_subscribers") == 1, 10, what="subscribed")

        async def read_the_turn() -> list[dict[str, Any]]:
            async with dex.Client(rig.server.address) as client:
                reading = asyncio.create_task(collect(client, sid, "turn.completed"))
                await asyncio.to_thread(
                    wait_until, lambda: metric(rig, "dex_stream_subscribers") == 2, 10
                )
                await client.send_message(sid, str(size))
                return await asyncio.wait_for(reading, 60)

        events = asyncio.run(read_the_turn())
        streamed = "".join(e["data"]["text"] for e in events if e["type"] == "model.delta")
        assert streamed == "y" * size  # the reader missed nothing
        assert not [e for e in events if e["type"].startswith("stream.")]

        stalled.settimeout(30)
        received = bytearray()
        while chunk := stalled.recv(1 << 20):  # reads again, until the server closes
            received += chunk
    finally:
        stalled.close()
    assert received.startswith(b"HTTP/1.1 200")
    tail = bytes(received[-2000:])
    assert b"event: stream.dropped\n" in tail  # the last thing it was sent
    assert received.count(b"event: model.delta") < size // 500  # what fit, then the notice
    assert metric(rig, "dex_stream_subscribers_dropped_total") == 1

"""``Client.stream_events`` against servers that send crafted bytes (multi-line data,
CRLF, a connection cut mid-event, a standby's 503, a 404), and the events route of the
real app: what reaches the stream backend, ``stream.dropped``, a client that leaves."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import dex
from dex.server.streams import Event, MemoryStreams
from dex.testing import free_port, wait_until_async
from tests.integration.conftest import AGENT, Api, fastapi_of, make_api_app

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
EVENT_STREAM = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


class Crafted:
    """A server that answers its Nth request with ``handlers[N]`` (the last one repeats),
    and keeps each request's headers and the moment it came."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = handlers
        self.requests: list[dict[str, str]] = []
        self.times: list[float] = []
        self.port = free_port()
        self.address = f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.times.append(time.monotonic())
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        self.requests.append({"request": lines[0], **{k.lower(): v for k, v in headers.items()}})
        handler = self.handlers[min(len(self.requests), len(self.handlers)) - 1]
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Crafted]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()


def whole(body: bytes) -> Handler:
    """An event stream that is ``body`` and ends (the connection closes)."""

    async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(EVENT_STREAM + b"connection: close\r\n\r\n" + body)
        await writer.drain()

    return handle


def cut(body: bytes) -> Handler:
    """A chunked event stream that sends ``body`` and dies before its last chunk."""

    async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(EVENT_STREAM + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(body), body))
        await writer.drain()
        writer.transport.abort()

    return handle


def error(status: int, code: str) -> Handler:
    async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b'{"error": {"code": "%s", "message": "crafted %d"}}' % (code.encode(), status)
        writer.write(
            b"HTTP/1.1 %d Crafted\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (status, len(body), body)
        )
        await writer.drain()

    return handle


async def take(
    stream: AsyncGenerator[dict[str, Any], None], count: int, timeout: float = 10
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in stream:
            events.append(event)
            if len(events) == count:
                return

    async with contextlib.aclosing(stream):
        await asyncio.wait_for(read(), timeout)
    return events


async def test_multi_line_data_crlf_comments_and_fields_without_a_space() -> None:
    body = (
        b": connected\r\n"
        b"retry: 10000\r\n"
        b"id: 1733150000000-0\r\n"
        b"event: history.item\r\n"
        b'data: {"index": 0,\r\n'
        b'data:  "item": {"type": "user",\r\n'
        b'data: "text": "hi"}}\r\n'
        b"\r\n"
        b"id:1733150000000-1\n"
        b"event:model.delta\n"
        b'data:{"text": "two\\nlines"}\n'
        b"\n"
        b": keep-alive\r\n\r\n"
        b'id: 1733150000000-2\rdata: {"turn": 1}\revent: turn.completed\r\r'
    )
    async with Crafted(whole(body)).running() as server, dex.Client(server.address) as client:
        events = [e async for e in client.stream_events("s1", reconnect=False)]
    assert events == [
        {
            "id": "1733150000000-0",
            "type": "history.item",
            "data": {"index": 0, "item": {"type": "user", "text": "hi"}},
        },
        {"id": "1733150000000-1", "type": "model.delta", "data": {"text": "two\nlines"}},
        {"id": "1733150000000-2", "type": "turn.completed", "data": {"turn": 1}},
    ]
    assert server.requests[0]["request"] == "GET /v1/sessions/s1/events HTTP/1.1"
    assert "last-event-id" not in server.requests[0]


async def test_a_stream_cut_mid_event_resumes_after_the_last_id_seen() -> None:
    first = (
        b'id: 1733150000000-0\nevent: model.delta\ndata: {"text": "a"}\n\n'
        b'id: 1733150000000-1\nevent: model.delta\ndata: {"text": "b"}\n\n'
        b'id: 1733150000000-2\nevent: model.delta\ndata: {"te'  # cut here
    )
    second = (
        b'id: 1733150000000-2\nevent: model.delta\ndata: {"text": "c"}\n\n'
        b'id: 1733150000000-3\nevent: turn.completed\ndata: {"turn": 1}\n\n'
    )
    crafted = Crafted(cut(first), whole(second))
    async with crafted.running() as server, dex.Client(server.address, timeout=10) as client:
        events = await take(client.stream_events("s1"), 4)
    assert [e["id"] for e in events] == [f"1733150000000-{n}" for n in range(4)]  # none twice
    assert [e["data"].get("text") for e in events] == ["a", "b", "c", None]
    assert len(server.requests) == 2
    assert "last-event-id" not in server.requests[0]
    assert server.requests[1]["last-event-id"] == "1733150000000-1"


async def test_a_given_last_event_id_is_sent_and_a_clean_end_reconnects_with_the_newest() -> None:
    crafted = Crafted(whole(b"id: 8\ndata: 8\n\n"), whole(b"id: 9\ndata: 9\n\n"))
    async with crafted.running() as server, dex.Client(server.address) as client:
        events = await take(client.stream_events("s1", last_event_id="7"), 2)
    assert [e["data"] for e in events] == [8, 9]
    assert [r["last-event-id"] for r in server.requests] == ["7", "8"]


async def test_a_standby_and_a_dead_address_are_passed_over() -> None:
    standby = Crafted(error(503, "not_serving"))
    active = Crafted(whole(b'id: 1\nevent: turn.started\ndata: {"turn": 1}\n\n'))
    dead = f"http://127.0.0.1:{free_port()}"
    async with standby.running(), active.running():
        addresses = [dead, standby.address, active.address]
        async with dex.Client(addresses, timeout=10) as client:
            (event,) = await take(client.stream_events("s1"), 1)
    assert event == {"id": "1", "type": "turn.started", "data": {"turn": 1}}
    assert len(standby.requests) == 1


async def test_the_server_s_retry_field_sets_the_wait_before_reconnecting() -> None:
    crafted = Crafted(whole(b"retry: 300\nid: 1\ndata: 1\n\n"), whole(b"id: 2\ndata: 2\n\n"))
    async with crafted.running() as server, dex.Client(server.address) as client:
        events = await take(client.stream_events("s1"), 2)
    assert [e["data"] for e in events] == [1, 2]
    assert server.times[1] - server.times[0] >= 0.3


@pytest.mark.parametrize(
    ("status", "code", "raised"),
    [(404, "not_found", dex.NotFound), (401, "unauthorized", dex.AuthError)],
)
async def test_a_4xx_is_raised_at_once_and_not_tried_again(
    status: int, code: str, raised: type[dex.DexError]
) -> None:
    refusing = Crafted(error(status, code))
    other = Crafted(whole(b"id: 1\ndata: 1\n\n"))
    async with refusing.running(), other.running():
        addresses = [refusing.address, other.address]
        async with dex.Client(addresses, timeout=10) as client:
            with pytest.raises(raised, match=f"crafted {status}"):
                await take(client.stream_events("s1"), 1)
    assert len(refusing.requests) == 1
    assert other.requests == []


async def test_a_4xx_on_reconnect_is_raised_too() -> None:
    crafted = Crafted(cut(b"id: 1\ndata: 1\n\n"), error(404, "not_found"))
    async with crafted.running() as server, dex.Client(server.address) as client:
        events: list[dict[str, Any]] = []
        with pytest.raises(dex.NotFound):
            async for event in client.stream_events("s1"):
                events.append(event)
    assert [e["id"] for e in events] == ["1"]
    assert len(server.requests) == 2


async def test_it_gives_up_when_no_stream_opens_within_the_timeout() -> None:
    failing = Crafted(error(500, "internal"))
    dead = f"http://127.0.0.1:{free_port()}"
    async with failing.running(), dex.Client([dead, failing.address], timeout=1) as client:
        started = time.monotonic()
        with pytest.raises(dex.Unavailable, match="the event stream of s1 broke") as caught:
            await take(client.stream_events("s1"), 1)
    assert caught.value.retryable
    assert time.monotonic() - started < 3  # the timeout, and the last try's wait at most
    assert len(failing.requests) >= 2  # rounds over both addresses, with backoff


async def test_without_reconnect_a_cut_raises_unavailable() -> None:
    crafted = Crafted(cut(b"id: 1\ndata: 1\n\n"))
    async with crafted.running() as server, dex.Client(server.address) as client:
        events: list[dict[str, Any]] = []
        with pytest.raises(dex.Unavailable, match="the event stream of s1 broke") as caught:
            async for event in client.stream_events("s1", reconnect=False):
                events.append(event)
    assert caught.value.retryable
    assert [e["id"] for e in events] == ["1"] and len(server.requests) == 1


# --- the events route of the real app ----------------------------------------------------------


class Scripted(MemoryStreams):
    """A backend whose subscription yields ``events`` and ends; it keeps each ``after``."""

    def __init__(self, *events: Event | None) -> None:
        super().__init__()
        self.events_sent = events
        self.afters: list[Any] = []

    async def subscribe(
        self, session_id: str, after: Any = None
    ) -> AsyncGenerator[Event | None, None]:
        self.afters.append(after)
        for event in self.events_sent:
            yield event


def test_the_route_sends_stream_dropped_last_and_ends(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    api_with_agent.sessions.reads.streams = Scripted(
        Event("5", "model.delta", {"text": "a"}),
        None,
        Event("", "stream.dropped", {"reason": "fell behind"}),
        Event("7", "model.delta", {"text": "never"}),
    )
    response = api_with_agent.http.get("/v1/sessions/s1/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store"
    assert response.text == (
        'id: 5\nevent: model.delta\ndata: {"text":"a"}\n\n'
        ": keep-alive\n\n"
        'event: stream.dropped\ndata: {"reason":"fell behind"}\n\n'
    )


@pytest.mark.parametrize("header", ["57", "1733150000000-3", "0-0", "9" * 19 + "-" + "9" * 19])
def test_last_event_id_of_either_form_is_taken(api_with_agent: Api, header: str) -> None:
    api_with_agent.create("s1")
    streams = api_with_agent.sessions.reads.streams = Scripted()
    for path in ("/v1/sessions/s1/events", "/ui/sessions/s1/events"):
        response = api_with_agent.http.get(path, headers={"last-event-id": header})
        assert response.status_code == 200, response.text
    assert streams.afters == [header, header]  # handed on as it came


async def test_a_client_that_leaves_ends_the_response(tmp_path: Path) -> None:
    """The subscription ends when the client goes, not at the next keep-alive (15 s)."""
    open_subscriptions: list[int] = [0]

    class Counted(MemoryStreams):
        async def subscribe(
            self, session_id: str, after: Any = None
        ) -> AsyncGenerator[Event | None, None]:
            open_subscriptions[0] += 1
            try:
                async for event in super().subscribe(session_id, after):
                    yield event
            finally:
                open_subscriptions[0] -= 1

    app = make_api_app(tmp_path / "data")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    try:
        await wait_until_async(lambda: asyncio.sleep(0, server.started), what="uvicorn started")
        sessions = fastapi_of(app).state.sessions
        await sessions.register_agents([AGENT])
        sessions.reads.streams = Counted()
        async with dex.Client(f"http://127.0.0.1:{port}") as client:
            await client.create_session(AGENT.name, "s1")
            sessions.reads.streams.publish("s1", "turn.started", {"turn": 1})
            events = client.stream_events("s1")
            assert (await anext(events))["type"] == "turn.started"
            assert open_subscriptions == [1]
            await events.aclose()

            async def closed() -> bool:
                return open_subscriptions == [0]

            await wait_until_async(closed, timeout=5, what="the subscription ended")
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 20)

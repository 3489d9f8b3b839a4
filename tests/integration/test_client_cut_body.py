"""A node that dies while it sends a response body (found by the soak: a node SIGKILLed
mid-response): the client tries a safe request again, and reports an unsafe one as
``dex.Unavailable``, never as a raw aiohttp error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import dex
from dex.testing import free_port

BODY = b'{"session": {"id": "s1"}}'


@pytest.fixture
async def dying_node() -> AsyncIterator[tuple[str, list[bytes]]]:
    """Answers its first request with a Content-Length it never fills, then closes the
    connection (a node killed mid-body); answers later requests in full."""
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        requests.append(request.split(b"\r\n", 1)[0])
        length = len(BODY) if len(requests) > 1 else 19395
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}"
        writer.write(head.encode() + b"\r\nconnection: close\r\n\r\n")
        writer.write(BODY if len(requests) > 1 else BODY[:5])
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        server.close()
        await server.wait_closed()


async def test_a_read_cut_mid_body_is_tried_again(dying_node: tuple[str, list[bytes]]) -> None:
    address, requests = dying_node
    async with dex.Client(address, timeout=10) as client:
        snapshot = await client.get_agent_snapshot("s1")
    assert snapshot == {"session": {"id": "s1"}}
    assert requests == [b"GET /v1/sessions/s1 HTTP/1.1"] * 2


async def test_an_unsafe_request_cut_mid_body_raises_unavailable(
    dying_node: tuple[str, list[bytes]],
) -> None:
    address, requests = dying_node
    async with dex.Client(address, timeout=10) as client:
        with pytest.raises(dex.Unavailable, match="no Dex Server answered"):
            await client.approve("s1", "c1")
    assert len(requests) == 1  # not repeated: it may have been committed

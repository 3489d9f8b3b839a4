"""A lean load client for session creation: keep-alive HTTP/1.1 over plain asyncio streams.

``dex.Client`` (aiohttp) spends about as much CPU per creation as the server does, and
the benchmark's clients share the server's cores, so ``bench.scale`` measured its own
client as much as the server. Each lane here holds one connection and loops
``POST /v1/sessions`` with the body and headers ``dex.Client.create_session`` sends,
reading the status line, ``Content-Length`` and the body, and counting a creation only
for a 201 whose body has a string ``id``.

    python -m bench.creator http://127.0.0.1:8080 --agent helper --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
import urllib.parse

import orjson


@dataclasses.dataclass
class Tally:
    """What the lanes did: creations, and answers that were not one (or broke the
    connection)."""

    created: int = 0
    failed: int = 0


def _request(address: str, agent: str, token: str | None) -> tuple[str, int, bytes]:
    """Host, port and the bytes of one creation request, the same each time."""
    url = urllib.parse.urlsplit(address)
    if url.scheme != "http" or url.hostname is None:
        raise ValueError(f"bench.creator speaks plain http only: {address!r}")
    port = url.port or 80
    body = orjson.dumps({"agent": agent})
    headers = [
        "POST /v1/sessions HTTP/1.1",
        f"host: {url.hostname}:{port}",
        "content-type: application/json",
        f"content-length: {len(body)}",
    ]
    if token:
        headers.append(f"authorization: Bearer {token}")
    return url.hostname, port, ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and its body (``Content-Length`` framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _has_id(body: bytes) -> bool:
    """Whether the answer is a JSON object with a string ``id``: a session."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and isinstance(answer.get("id"), str)


async def create(
    address: str,
    agent: str,
    *,
    clients: int = 64,
    seconds: float = 10.0,
    limit: int | None = None,
    token: str | None = None,
) -> Tally:
    """Create sessions of ``agent`` from ``clients`` connections for ``seconds``, or
    until ``limit`` requests were sent. ``token`` defaults to ``DEX_CLIENT_TOKEN``."""
    host, port, request = _request(address, agent, token or os.environ.get("DEX_CLIENT_TOKEN"))
    tally = Tally()
    until = time.monotonic() + seconds
    sent = 0

    def more() -> bool:
        nonlocal sent
        if time.monotonic() >= until or (limit is not None and sent >= limit):
            return False
        sent += 1
        return True

    async def lane() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while more():
                writer.write(request)
                try:
                    status, body = await _answer(reader)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    tally.failed += 1
                    return
                if status == 201 and _has_id(body):
                    tally.created += 1
                else:
                    tally.failed += 1
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(lane() for _ in range(clients)))
    return tally


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("address")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    t0, cpu0 = time.monotonic(), time.process_time()
    tally = asyncio.run(
        create(args.address, args.agent, clients=args.clients, seconds=args.seconds)
    )
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    print(
        f"{tally.created} created, {tally.failed} failed in {wall:.1f} s: "
        f"{tally.created / wall:.0f}/s, client CPU {cpu / max(tally.created, 1) * 1e6:.0f} µs each"
    )


if __name__ == "__main__":
    main()

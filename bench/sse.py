"""The event stream's cost: the server's response (Dex's hand-written bytes on Starlette's
``StreamingResponse`` against sse-starlette) and the client's parser (the new one against
the one it replaced).

    .venv/bin/python -m bench.sse                  # ~1 min
    .venv/bin/python -m bench.sse --events 20000   # quicker

**Server.** The real app (``dex.server.app.asgi``, every layer in front of the routes)
under uvicorn on uvloop in a child process, and one aiohttp connection from this process
reading ``GET /v1/sessions/{id}/events`` to its end. The session's stream is a firehose:
``--events`` ``model.delta`` events made by the in-memory backend, handed to the route as
fast as it takes them, then the end of the stream (so the response ends). What differs
between the variants is only what the route answers with:

- ``dex``: the route as it is (``dex.server.api.sse``: bytes on ``StreamingResponse``);
- ``sse-starlette``: ``EventSourceResponse`` of a ``ServerSentEvent`` per event, as its
  documentation writes it;
- ``sse-starlette, bytes``: ``EventSourceResponse`` of Dex's own bytes (its ping,
  disconnect and shutdown handling, none of its encoding).

Rounds alternate the variants; each figure is the best of ``--rounds``. Printed: events/s
through the connection, the server process's CPU per event (``/proc``, user + system),
and both as ratios to ``dex``.

**Client.** The same bytes the ``dex`` variant sends, fed in 64 KiB chunks (as a socket
hands them over) through an aiohttp ``StreamReader`` to each parser in this process:
events parsed per CPU second, best of ``--rounds`` (at least 5), and the ratio new / old.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
from aiohttp.base_protocol import BaseProtocol
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from dex.client import sse as client_sse
from dex.server.api import sse
from dex.server.streams import Event, MemoryStreams, Rings
from dex.testing import free_port

SESSION = "bench-sse"
TICKS = os.sysconf("SC_CLK_TCK")

# --- what the route answers with ---------------------------------------------------------------


def sse_starlette(events: AsyncGenerator[Event | None, None]) -> StreamingResponse:
    async def messages() -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            if event is not None:  # its own timer sends the keep-alive pings
                data = orjson.dumps(event.data).decode()
                yield ServerSentEvent(data, id=str(event.id), event=event.type)

    response: Any = EventSourceResponse(messages())  # a Response, not a StreamingResponse
    return response  # type: ignore[no-any-return]


def sse_starlette_bytes(events: AsyncGenerator[Event | None, None]) -> StreamingResponse:
    response: Any = EventSourceResponse(sse.body(events), ping=0)  # Dex's body keeps alive
    return response  # type: ignore[no-any-return]


VARIANTS: dict[str, Callable[[AsyncGenerator[Event | None, None]], StreamingResponse]] = {
    "dex": sse.response,
    "sse-starlette": sse_starlette,
    "sse-starlette, bytes": sse_starlette_bytes,
}


def delta(number: int) -> dict[str, Any]:
    return {"attempt_id": "9f0c2b1e7d4a4c8e", "step_id": "1.1", "text": f"token {number} "}


async def made_events(count: int) -> list[Event]:
    """``count`` deltas as the in-memory backend numbers them."""
    streams = MemoryStreams(Rings(keep=count, max_events=count))
    streams.publish(SESSION, "turn.started", {"turn": 1})  # a stream: deltas are kept
    for number in range(count):
        streams.publish(SESSION, "model.delta", delta(number))
    events: list[Event] = []
    async for event in streams.subscribe(SESSION):
        if event is not None and event.type == "model.delta":
            events.append(event)
            if len(events) == count:
                break
    return events


class Firehose(MemoryStreams):
    """Every subscriber gets the same events as fast as it takes them, then the end."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.made = events

    async def subscribe(
        self, session_id: str, after: Any = None
    ) -> AsyncGenerator[Event | None, None]:
        for event in self.made:
            yield event


def serve(variant: str, port: int, data_dir: str, events: int) -> None:
    """The child process: the node, its route answering with ``variant``."""
    import uvicorn

    from dex import _loop
    from dex.server.app import asgi
    from dex.server.config import ServerConfig
    from dex.wire import AgentSpec

    config = ServerConfig(data_dir=Path(data_dir), listen=f"127.0.0.1:{port}")
    app: Any = asgi(config)
    fastapi_app = app
    while not isinstance(fastapi_app, FastAPI):
        fastapi_app = fastapi_app.app
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )

    async def main() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        sessions = fastapi_app.state.sessions
        spec = AgentSpec(name="bench", model={"provider": "scripted", "name": "bench"})
        await sessions.register_agents([spec])
        sessions.streams = Firehose(await made_events(events))
        await serving

    with mock.patch.object(sse, "response", VARIANTS[variant]):  # what the route calls
        _loop.run(main())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@dataclass
class Run:
    events: int
    seconds: float
    server_cpu: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_per_event(self) -> float:
        return self.server_cpu / self.events


async def read_stream(address: str, pid: int) -> Run:
    async with aiohttp.ClientSession() as http:
        for _ in range(500):  # until the child has made its events and serves them
            async with http.get(f"{address}/v1/agents") as response:
                agents = (await response.json())["agents"] if response.status == 200 else []
            if agents:
                break
            await asyncio.sleep(0.02)
        async with http.post(
            f"{address}/v1/sessions", json={"agent": "bench", "session_id": SESSION}
        ) as response:
            assert response.status == 201, await response.text()
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        count, tail = 0, b""
        async with http.get(f"{address}/v1/sessions/{SESSION}/events") as response:
            assert response.status == 200, await response.text()
            async for chunk in response.content.iter_any():
                window = tail + chunk
                count += window.count(b"\ndata:")  # the line before a data line ends there
                tail = window[-5:]
        seconds = time.perf_counter() - started
        return Run(count, seconds, cpu_seconds(pid) - cpu)


def run_server(variant: str, events: int, tmp: Path) -> Run:
    port = free_port()
    data = tmp / f"data-{variant.replace(', ', '-')}-{port}"
    child = multiprocessing.get_context("spawn").Process(
        target=serve, args=(variant, port, str(data), events)
    )
    child.start()
    try:
        assert child.pid is not None
        for _ in range(500):
            try:
                return asyncio.run(read_stream(f"http://127.0.0.1:{port}", child.pid))
            except aiohttp.ClientConnectionError:
                time.sleep(0.02)  # not listening yet
        raise RuntimeError(f"the {variant} node never answered")
    finally:
        child.terminate()
        child.join(10)


# --- the client's parser --------------------------------------------------------------------


async def old_parse(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """``Client.stream_events`` before: a line at a time, one ``data:`` line kept."""
    event: dict[str, Any] = {}
    async for raw in content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(": ")
            if name == "id":
                event["id"] = int(value)
            elif name == "event":
                event["type"] = value
            elif name == "data":
                event["data"] = orjson.loads(value)


async def new_parse(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """``Client.stream_events`` now: its decoder over the chunks as they come."""
    decoder = client_sse.Decoder()
    async for chunk in content.iter_any():
        for message in decoder.feed(chunk):
            yield client_sse.event(message)


def fed(payload: bytes) -> aiohttp.StreamReader:
    loop = asyncio.get_running_loop()
    # a limit that holds it all: no socket to pause while it waits to be read
    reader = aiohttp.StreamReader(BaseProtocol(loop), len(payload), loop=loop)
    for start in range(0, len(payload), 1 << 16):
        reader.feed_data(payload[start : start + (1 << 16)])
    reader.feed_eof()
    return reader


async def parse_rate(
    parse: Callable[[aiohttp.StreamReader], AsyncIterator[dict[str, Any]]],
    payload: bytes,
    events: int,
) -> float:
    reader = fed(payload)
    started = time.process_time()  # one thread: its CPU, less moved by a busy machine
    count = 0
    async for _ in parse(reader):
        count += 1
    seconds = time.process_time() - started
    assert count == events, (count, events)
    return events / seconds


# --- the report ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    runs: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="dex-bench-sse-") as tmp:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                run = run_server(variant, args.events, Path(tmp))
                assert run.events == args.events, (variant, run.events)
                runs[variant].append(run)
    rate = {variant: max(r.rate for r in done) for variant, done in runs.items()}
    cpu = {variant: min(r.cpu_per_event for r in done) for variant, done in runs.items()}
    print(f"server: {args.events} model.delta events through one connection, best of {args.rounds}")
    print(f"{'response':<22}{'events/s':>10}{'ratio':>8}{'server CPU/event':>19}{'ratio':>8}")
    for variant in VARIANTS:
        print(
            f"{variant:<22}{rate[variant]:>10,.0f}{rate[variant] / rate['dex']:>8.2f}"
            f"{cpu[variant] * 1e6:>16.1f} us{cpu[variant] / cpu['dex']:>8.2f}"
        )

    events = asyncio.run(made_events(args.events))
    payload = b"".join(sse.encode(event) for event in events)
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(max(args.rounds, 5)):  # alternating, as the server's variants
        rates["old"].append(asyncio.run(parse_rate(old_parse, payload, args.events)))
        rates["new"].append(asyncio.run(parse_rate(new_parse, payload, args.events)))
    old, new = max(rates["old"]), max(rates["new"])
    print(f"\nclient: the same {args.events} events parsed, {len(payload) / 1e6:.1f} MB")
    print(f"{'parser':<22}{'events/CPU s':>14}{'ratio':>8}")
    print(f"{'old (line by line)':<22}{old:>14,.0f}{1:>8.2f}")
    print(f"{'new (Decoder)':<22}{new:>14,.0f}{new / old:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What uvicorn costs a request, against a bare asyncio protocol serving the same answer.

    .venv/bin/python -m bench.frontend [--clients 64 1] [--seconds 3] [--rounds 2]

The node serves HTTP with uvicorn (httptools, uvloop), and the question a front end of
its own would answer is how much of a request's CPU is uvicorn's. Two servers answer
every ``POST`` with the same fixed 201 JSON body, each in its own process on uvloop:

- ``uvicorn``: a bare ASGI app (no framework) behind uvicorn, with the node's settings
  (no access log, no proxy headers, no ``server`` header);
- ``protocol``: an ``asyncio.Protocol`` parsing with ``httptools``, the parser uvicorn
  uses, and writing the answer from a future's callback (as a route that awaits a commit
  would), with no ASGI messages and no task per request.

``bench.creator``'s keep-alive lanes load each in turn, the order alternating by round,
and the server process's CPU per request is read from ``/proc``. The difference is the
most a front end without uvicorn could save a request; the Dex routes' own work (a
session creation's whole cost is ``bench.creations``') comes on top of either.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from typing import Any, cast

from bench import creator
from bench.turns import cpu_seconds
from dex.testing.harness import free_port

BODY = b'{"id":"s_0197a0f1c2d3e4f5a6b7c8d9","agent":"helper","status":"idle"}'
HEAD = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
KINDS = ("uvicorn", "protocol")


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


class Bare(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (as the lanes send)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools

        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        answered = asyncio.get_running_loop().create_future()
        answered.add_done_callback(self._answer)
        answered.set_result(body)

    def _answer(self, _: asyncio.Future[bytes]) -> None:
        self.transport.write(HEAD % len(BODY) + BODY)


def serve(kind: str, port: int) -> None:
    import uvloop

    if kind == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            asgi,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
        )
        uvicorn.Server(config).run()
        return

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


async def measure(kind: str, clients: int, seconds: float) -> tuple[float, float]:
    """Server CPU per request (µs) and requests/s, for one server under ``clients`` lanes."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.frontend", "--serve", kind, str(port)
    )
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # up once it answers
            try:
                await creator.create(address, "helper", clients=1, limit=1, seconds=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise RuntimeError(f"the {kind} server did not start") from None
                await asyncio.sleep(0.05)
        await creator.create(address, "helper", clients=clients, seconds=0.5)  # warm-up
        cpu, start = cpu_seconds(proc.pid), time.monotonic()
        tally = await creator.create(address, "helper", clients=clients, seconds=seconds)
        cpu, wall = cpu_seconds(proc.pid) - cpu, time.monotonic() - start
    finally:
        proc.kill()
        await proc.wait()
    if tally.failed or not tally.created:
        raise RuntimeError(f"{kind}: {tally.failed} requests failed")
    return cpu / tally.created * 1e6, tally.created / wall


async def bench(args: argparse.Namespace) -> str:
    out = [
        "Server CPU per request, a fixed 201 answer to a POST (median of rounds; requests/s)",
        f"{'clients':>7}  {'uvicorn':>16}  {'bare protocol':>16}  {'uvicorn adds':>12}",
    ]
    for clients in args.clients:
        runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for r in range(args.rounds):
            for kind in KINDS if r % 2 == 0 else reversed(KINDS):
                runs[kind].append(await measure(kind, clients, args.seconds))
        cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
        rate = {k: statistics.median(r for _, r in v) for k, v in runs.items()}
        cells = [f"{cpu[k]:6.1f} µs ({rate[k]:6.0f}/s)" for k in KINDS]
        out.append(
            f"{clients:7d}  {cells[0]:>16}  {cells[1]:>16}  "
            f"{cpu['uvicorn'] - cpu['protocol']:9.1f} µs"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.frontend", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 1])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        kind, port = args.serve
        if kind not in KINDS:
            parser.error(f"--serve: one of {', '.join(KINDS)}")
        serve(kind, int(port))
        return 0
    if args.seconds <= 0 or args.rounds < 1 or min(args.clients) < 1:
        parser.error("--seconds > 0, --rounds >= 1, --clients >= 1")
    print(asyncio.run(bench(args)))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

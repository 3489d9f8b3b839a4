"""A TCP proxy a test controls, to cut the network between two processes on loopback.

with TcpProxy("127.0.0.1", 5432).in_thread() as proxy:
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"   # connect through it
    ...
    proxy.cut()       # from now on nothing passes, both ways, and nothing is closed:
                      # peers see silence, as behind a partition
    proxy.restore()   # new connections pass again (cut ones stay dead)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from dex.testing.harness import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self.severed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        """Stop forwarding, both ways, on every connection, without closing any."""
        self.severed = True

    def restore(self) -> None:
        self.severed = False

    def retarget(self, host: str, port: int) -> None:
        """Send new connections elsewhere (what a balancer following a readiness probe
        does); the open ones are closed, as the old target went away."""
        self.target = (host, port)
        if self._loop is not None:
            for writer in list(self._writers):
                self._loop.call_soon_threadsafe(writer.close)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.severed:
                    await asyncio.Event().wait()  # swallow it: silence, not a close
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not self.severed:
                writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.severed:
            await asyncio.Event().wait()  # a new connection hangs, unanswered
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[TcpProxy]:
        """Serve from a background thread while the block runs."""
        started = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
            stop.append(asyncio.Event())
            started.set()
            async with server:
                await stop[0].wait()
            for writer in self._writers:  # the cut connections too
                writer.close()
            await asyncio.sleep(0)

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            finally:
                for task in asyncio.all_tasks(self._loop):
                    task.cancel()
                self._loop.run_until_complete(asyncio.sleep(0))
                self._loop.close()

        thread = threading.Thread(target=run, name="dex-tcp-proxy", daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)

"""The skeleton every fake provider shares: the HTTP server, the scripted turn of one
request, and the streaming that can drop, truncate or pause part way.

A provider (``FakeAnthropic``, ``FakeOpenAI``) says how it authenticates and words its
errors; each of its APIs is an ``Endpoint`` that checks a request and turns a ``Reply``
into the API's JSON body or its stream of events.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Self

from aiohttp import web

from dex.testing.fake_providers._script import (
    Entry,
    Fail,
    RateLimit,
    RecordedRequest,
    Reply,
    Script,
)

Event = tuple[bytes, bool]
"""An SSE event, and whether it carried a content chunk (counted by drop/pause/truncate)."""


class Rejected(Exception):
    """A request the real API would refuse with HTTP 400."""


class Endpoint(abc.ABC):
    """One API of a provider: ``POST path``, answered from the script."""

    path: str
    id_prefix: str
    """Of the id the answer carries (a message, completion or response id)."""
    no_model: str
    """The API's words for a request without a model."""

    def check_body(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise Rejected(self.no_model)
        self.check(body)

    @abc.abstractmethod
    def check(self, body: dict[str, Any]) -> None:
        """Raise ``Rejected`` where the real API answers 400 (a body with a model)."""

    @abc.abstractmethod
    def answer(self, reply: Reply, body: dict[str, Any], ident: str) -> dict[str, Any]:
        """The whole JSON body, when the request does not stream."""

    @abc.abstractmethod
    def stream(self, reply: Reply, body: dict[str, Any], ident: str) -> Iterator[Event]:
        """The events of a streamed answer."""

    @abc.abstractmethod
    def broken(
        self, fail: Fail, body: dict[str, Any], ident: str, error: dict[str, Any]
    ) -> Iterable[Event]:
        """A stream that began and then reports ``fail`` (``error`` is the provider's
        error body for it)."""


class FakeProvider:
    """An aiohttp server on 127.0.0.1 (a free port) that plays ``script``."""

    endpoints: Sequence[Endpoint] = ()

    def __init__(
        self,
        script: Script,
        *,
        api_key: str | None = "test-key",
        rate_limit: RateLimit | None = None,
    ) -> None:
        self._script = script
        self._entries: Iterator[Entry] | None = None if callable(script) else iter(list(script))
        self.api_key = api_key
        """The key requests must carry; None accepts any."""
        self.rate_limit = rate_limit
        """Refuses requests with 429 before they take an entry of the script."""
        self.requests: list[RecordedRequest] = []
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._ids = itertools.count(1)
        self.port = 0
        self.paused = 0
        """How many replies have reached their ``pause_after`` point (a stream held open)."""

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        for endpoint in self.endpoints:
            app.router.add_post(endpoint.path, partial(self._serve, endpoint))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextmanager
    def in_thread(self) -> Iterator[Self]:
        """Serve from a thread with its own event loop: for synchronous tests, and tests
        whose Workers run in other processes. Read ``requests`` and ``paused`` from the
        test; a ``resume`` event would belong to the server's loop, so use stalls
        (``pause_after`` without ``resume``) here."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-provider", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(30)
            try:
                yield self
            finally:
                asyncio.run_coroutine_threadsafe(self.close(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what each provider says in its own way ----------------------------------------

    def admit(self, request: web.Request) -> web.Response | None:
        """The error response for a request without the right key (or raise ``Rejected``
        for a missing header the API requires); None lets it through."""
        raise NotImplementedError

    def error_body(self, status: int, message: str, error_type: str | None) -> dict[str, Any]:
        """The provider's JSON error body; ``error_type`` None: the one it uses for
        ``status``."""
        raise NotImplementedError

    def response_headers(self) -> dict[str, str]:
        return {}

    # --- one request -----------------------------------------------------------------

    async def _serve(self, endpoint: Endpoint, request: web.Request) -> web.StreamResponse:
        """Check the request, take the script's next entry and answer with it: at once
        (a ``Fail``, or a body without ``stream``) or as a stream of events."""
        try:
            body = await self._receive(request)
            refused = self.admit(request)
            if refused is not None:
                return refused
            endpoint.check_body(body)
        except Rejected as e:
            return self.error(400, str(e))
        wait = self.rate_limit.refuse() if self.rate_limit is not None else None
        if wait is not None:
            return self.error(429, "rate limit exceeded", headers={"retry-after": f"{wait:g}"})
        entry = self.next_entry(body)
        if entry is None:
            return self.error(
                400, f"fake server: the script has no entry for request {len(self.requests)}"
            )
        streams = bool(body.get("stream"))
        if isinstance(entry, Fail) and not (entry.in_stream and streams):
            return self.error(entry.status, entry.message, entry.error_type, entry.headers)
        ident = self.new_id(endpoint.id_prefix)
        if isinstance(entry, Fail):
            error = self.error_body(entry.status, entry.message, entry.error_type)
            events = endpoint.broken(entry, body, ident, error)
            return await self._play(request, Reply(), iter(events))
        if not streams:
            answer = endpoint.answer(entry, body, ident)
            return web.json_response(answer, headers=self.response_headers())
        return await self._play(request, entry, endpoint.stream(entry, body, ident))

    def error(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        """An error response in the provider's own format."""
        return web.json_response(
            self.error_body(status, message, error_type),
            status=status,
            headers={**self.response_headers(), **(headers or {})},
        )

    def next_entry(self, body: dict[str, Any]) -> Entry | None:
        if callable(self._script):
            return self._script(body)
        assert self._entries is not None
        return next(self._entries, None)

    async def _receive(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise Rejected("the body is not JSON") from None
        if not isinstance(body, dict):
            raise Rejected("the body is not a JSON object")
        self.requests.append(RecordedRequest(request.path, dict(request.headers), body))
        return body

    async def _play(
        self, request: web.Request, reply: Reply, events: Iterator[Event]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        response.headers.update(self.response_headers())
        await response.prepare(request)
        sent = 0
        try:
            for data, content in events:
                sent += content
                pausing = content and sent == reply.pause_after
                if pausing:  # counted before the client can see the chunk
                    self.paused += 1
                await response.write(data)
                if not content:
                    continue
                if sent == reply.drop_after:
                    _cut(request)
                    return response
                if sent == reply.truncate_after:
                    break
                if pausing:
                    await self._wait(reply.resume)
                    if self._closing.is_set():
                        _cut(request)
                        return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        return response

    async def _wait(self, resume: asyncio.Event | None) -> None:
        waits = [asyncio.ensure_future(self._closing.wait())]
        if resume is not None:
            waits.append(asyncio.ensure_future(resume.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_fake_{next(self._ids)}"


def _cut(request: web.Request) -> None:
    """Drop the connection without finishing the (chunked) body."""
    if request.transport is not None:
        request.transport.abort()


# --- the pieces the APIs are written with ------------------------------------------------


def sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def typed(kind: str, content: bool = False, **fields: Any) -> Event:
    """An SSE event named ``kind`` whose data carries ``"type": kind`` (Anthropic, Responses)."""
    return sse(kind, {"type": kind, **fields}), content


def check_tool_schema(name: str, schema: Any) -> None:
    """As both providers do: a tool's parameters are a JSON Schema of an object, whose
    properties are schemas too."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise Rejected(f"tools: the schema of {name!r} must be a JSON Schema of type 'object'")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict) for p in properties.values()
    ):
        raise Rejected(f"tools: the properties of {name!r} must be JSON Schemas")

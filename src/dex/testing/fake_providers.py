"""Local fake model servers that speak the providers' HTTP protocols and play a script.

``FakeAnthropic`` speaks the Anthropic Messages API (``POST /v1/messages``) and
``FakeOpenAI`` speaks OpenAI Chat Completions (``POST /v1/chat/completions``) and
Responses (``POST /v1/responses``), streamed as Server-Sent Events the way the real
services send them (or as one JSON body when ``stream`` is off). Point the real SDK
client, or a ``dex.models`` model, at ``server.base_url``:

    async with FakeAnthropic([Reply(tool_calls=[ScriptedCall("lookup", {"key": "a"})]),
                              Fail(429),
                              Reply("done")]) as server:
        model = Anthropic(model="claude-test", base_url=server.base_url,
                          api_key=server.api_key)

Each request takes the next entry of the script (or the script is a function of the
request body). ``server.requests`` records every request. The servers check what the
real APIs check and that a translation bug would break (the API key; every tool call
answered by a result right after it, and no result without its call) and answer 400
like the real API when a request breaks those rules.

A ``Reply`` can misbehave part way: ``drop_after=n`` cuts the connection after ``n``
content chunks (text pieces and tool-argument pieces), ``truncate_after=n`` ends the
body cleanly without the final events, and ``pause_after=n`` waits for ``resume`` (an
``asyncio.Event``; without one, until the server closes) before sending the rest;
``server.paused`` counts the replies that reached that point.

Use ``async with server:`` in an async test, or ``with server.in_thread():`` to serve
from a background thread (a synchronous test, or Workers in other processes).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

__all__ = [
    "Entry",
    "Fail",
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeProvider",
    "RecordedRequest",
    "Reply",
    "Script",
    "ScriptedCall",
]


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of a scripted reply. A ``str`` ``arguments`` is sent as it is, so a
    test can send argument text that is not valid JSON."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def argument_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@dataclass(frozen=True)
class Reply:
    """A model response: text, then tool calls, streamed in chunks of ``chunk_chars``."""

    text: str = ""
    tool_calls: Sequence[ScriptedCall] = ()
    stop_reason: str | None = None
    """``end_turn``, ``tool_use`` or ``max_tokens``; by default ``tool_use`` when there are
    tool calls, else ``end_turn``. Sent in each provider's own words."""
    input_tokens: int = 21
    output_tokens: int = 13
    chunk_chars: int = 5
    drop_after: int | None = None
    truncate_after: int | None = None
    pause_after: int | None = None
    resume: asyncio.Event | None = None

    @property
    def stop(self) -> str:
        return self.stop_reason or ("tool_use" if self.tool_calls else "end_turn")

    def text_chunks(self) -> list[str]:
        return _chunks(self.text, self.chunk_chars)

    def argument_chunks(self, call: ScriptedCall) -> list[str]:
        return _chunks(call.argument_text(), self.chunk_chars)


@dataclass(frozen=True)
class Fail:
    """An error: HTTP ``status`` with the provider's error body, or (``in_stream``) an
    HTTP 200 stream that reports the error after it began."""

    status: int
    message: str = "scripted failure"
    error_type: str | None = None
    """The provider's error type; by default the one the provider uses for ``status``."""
    headers: Mapping[str, str] = field(default_factory=dict)
    in_stream: bool = False


Entry = Reply | Fail
Script = Sequence[Entry] | Callable[[dict[str, Any]], Entry]


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]


class _Rejected(Exception):
    """A request the real API would refuse with HTTP 400."""


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


# An SSE event, and whether it carried a content chunk (counted by drop/pause/truncate).
_Event = tuple[bytes, bool]


class FakeProvider:
    """An aiohttp server on 127.0.0.1 (a free port) that plays ``script``."""

    def __init__(self, script: Script, *, api_key: str | None = "test-key") -> None:
        self._script = script
        self._entries: Iterator[Entry] | None = None if callable(script) else iter(list(script))
        self.api_key = api_key
        """The key requests must carry; None accepts any."""
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
        self.routes(app)
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

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _error(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        """An error response in the provider's own format."""
        raise NotImplementedError

    def _take(self, body: dict[str, Any]) -> Entry | web.Response:
        """The script's next entry for this request, or the error response it calls for:
        a ``Fail`` answers at once unless it is meant to break a stream part way."""
        entry = self.next_entry(body)
        if entry is None:
            return self._error(
                400, f"fake server: the script has no entry for request {len(self.requests)}"
            )
        if isinstance(entry, Fail) and not (entry.in_stream and body.get("stream")):
            return self._error(entry.status, entry.message, entry.error_type, entry.headers)
        return entry

    # --- shared machinery ------------------------------------------------------------

    def next_entry(self, body: dict[str, Any]) -> Entry | None:
        if callable(self._script):
            return self._script(body)
        assert self._entries is not None
        return next(self._entries, None)

    async def _receive(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise _Rejected("the body is not JSON") from None
        if not isinstance(body, dict):
            raise _Rejected("the body is not a JSON object")
        self.requests.append(RecordedRequest(request.path, dict(request.headers), body))
        return body

    async def _play(
        self, request: web.Request, reply: Reply, events: Iterator[_Event]
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

    def response_headers(self) -> dict[str, str]:
        return {}

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_fake_{next(self._ids)}"


def _cut(request: web.Request) -> None:
    """Drop the connection without finishing the (chunked) body."""
    if request.transport is not None:
        request.transport.abort()


def _typed(kind: str, content: bool = False, **fields: Any) -> _Event:
    """An SSE event named ``kind`` whose data carries ``"type": kind`` (Anthropic, Responses)."""
    return _sse(kind, {"type": kind, **fields}), content


def _sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


# --- Anthropic Messages ------------------------------------------------------------------

_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class FakeAnthropic(FakeProvider):
    """``POST /v1/messages``; the SDK's ``base_url`` is ``server.base_url``."""

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._messages)

    def response_headers(self) -> dict[str, str]:
        return {"request-id": self.new_id("req")}

    def _error(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        kind = error_type or _ANTHROPIC_ERRORS.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(
            body, status=status, headers={**self.response_headers(), **(headers or {})}
        )

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._receive(request)
            if self.api_key is not None and self.api_key not in (
                request.headers.get("x-api-key"),
                request.headers.get("authorization", "").removeprefix("Bearer "),
            ):  # SDK versions send the key as x-api-key or as a bearer token
                return self._error(401, "invalid x-api-key")
            if "anthropic-version" not in request.headers:
                raise _Rejected("anthropic-version: header is required")
            _check_anthropic(body)
        except _Rejected as e:
            return self._error(400, str(e))
        entry = self._take(body)
        if isinstance(entry, web.Response):
            return entry
        model = body["model"]
        if not body.get("stream"):
            assert isinstance(entry, Reply)
            return web.json_response(self._message(entry, model), headers=self.response_headers())
        if isinstance(entry, Fail):
            kind = entry.error_type or _ANTHROPIC_ERRORS.get(entry.status, "api_error")
            events = [
                _typed("message_start", message=self._message(Reply(), model, start=True)),
                _typed("error", error={"type": kind, "message": entry.message}),
            ]
            return await self._play(request, Reply(), iter(events))
        return await self._play(request, entry, self._events(entry, model))

    def _message(self, reply: Reply, model: str, *, start: bool = False) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if not start:
            if reply.text:
                content.append({"type": "text", "text": reply.text})
            for i, call in enumerate(reply.tool_calls):
                try:
                    arguments = json.loads(call.argument_text())
                except ValueError:
                    arguments = {}
                content.append(
                    {
                        "type": "tool_use",
                        "id": call.id or f"toolu_fake_{i}",
                        "name": call.name,
                        "input": arguments,
                    }
                )
        return {
            "id": self.new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": None if start else reply.stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens,
                "output_tokens": 1 if start else reply.output_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def _events(self, reply: Reply, model: str) -> Iterator[_Event]:
        start = self._message(reply, model, start=True)
        yield _typed("message_start", message=start)
        yield _typed("ping")
        index = 0
        if reply.text:
            text_block = {"type": "text", "text": ""}
            yield _typed("content_block_start", index=index, content_block=text_block)
            for piece in reply.text_chunks():
                delta = {"type": "text_delta", "text": piece}
                yield _typed("content_block_delta", True, index=index, delta=delta)
            yield _typed("content_block_stop", index=index)
            index += 1
        for i, call in enumerate(reply.tool_calls):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.id or f"toolu_fake_{start['id']}_{i}",
                "name": call.name,
                "input": {},
            }
            yield _typed("content_block_start", index=index, content_block=block)
            for piece in reply.argument_chunks(call) or [""]:
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield _typed("content_block_delta", bool(piece), index=index, delta=delta)
            yield _typed("content_block_stop", index=index)
            index += 1
        stop = {"stop_reason": reply.stop, "stop_sequence": None}
        yield _typed("message_delta", delta=stop, usage={"output_tokens": reply.output_tokens})
        yield _typed("message_stop")


def _check_anthropic(body: dict[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _Rejected("model: Field required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise _Rejected("max_tokens: Field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Rejected("messages: at least one message is required")
    for tool in body.get("tools") or []:
        if not tool.get("name") or not isinstance(tool.get("input_schema"), dict):
            raise _Rejected("tools: each tool needs a name and an input_schema")
        _check_tool_schema(tool["name"], tool["input_schema"])
    if messages[0].get("role") != "user":
        raise _Rejected("messages: the first message must use the user role")
    expected: set[str] = set()  # tool_use ids of the previous assistant message
    for n, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if role not in ("user", "assistant") or not isinstance(blocks, list):
            raise _Rejected(f"messages.{n}: a role of user or assistant and a content")
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if expected:
            leading = [
                b.get("tool_use_id")
                for b in itertools.takewhile(lambda b: b.get("type") == "tool_result", blocks)
            ]
            if role != "user" or set(leading) != expected or len(leading) != len(results):
                raise _Rejected(
                    f"messages.{n}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {sorted(expected - set(leading))}; each `tool_use` "
                    "block must have a corresponding `tool_result` block in the next message, "
                    "and tool_result blocks must come first"
                )
        elif results:
            raise _Rejected(
                f"messages.{n}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{results}. Each `tool_result` block must have a corresponding `tool_use` "
                "block in the previous message."
            )
        expected = set()
        for b in blocks:
            kind = b.get("type")
            if kind == "text" and not b.get("text"):
                raise _Rejected(f"messages.{n}: text content blocks must be non-empty")
            if kind == "tool_use":
                if role != "assistant":
                    raise _Rejected(f"messages.{n}: tool_use blocks belong to the assistant")
                if not isinstance(b.get("input"), dict):
                    raise _Rejected(f"messages.{n}: tool_use.input: Input should be an object")
                expected.add(b.get("id"))
    if expected:
        raise _Rejected("the last message has `tool_use` blocks without `tool_result` blocks")


# --- OpenAI Chat Completions and Responses --------------------------------------------------

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}
_CHAT_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


class FakeOpenAI(FakeProvider):
    """``POST /v1/chat/completions`` and ``POST /v1/responses``; the SDK's ``base_url`` is
    ``server.base_url`` (which ends in ``/v1``)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)

    def response_headers(self) -> dict[str, str]:
        return {"x-request-id": self.new_id("req")}

    def _error_object(self, status: int, message: str, error_type: str | None) -> dict[str, Any]:
        kind, code = _OPENAI_ERRORS.get(status, ("server_error", None))
        if error_type is not None:
            kind = code = error_type
        return {"message": message, "type": kind, "param": None, "code": code}

    def _error(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        return web.json_response(
            {"error": self._error_object(status, message, error_type)},
            status=status,
            headers={**self.response_headers(), **(headers or {})},
        )

    async def _begin(
        self, request: web.Request, check: Callable[[dict[str, Any]], None]
    ) -> tuple[dict[str, Any], Entry] | web.Response:
        try:
            body = await self._receive(request)
            if self.api_key is not None and (
                request.headers.get("authorization") != f"Bearer {self.api_key}"
            ):
                return self._error(401, "Incorrect API key provided")
            check(body)
        except _Rejected as e:
            return self._error(400, str(e))
        entry = self._take(body)
        if isinstance(entry, web.Response):
            return entry
        return body, entry

    # --- Chat Completions ---

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        begun = await self._begin(request, _check_chat)
        if isinstance(begun, web.Response):
            return begun
        body, entry = begun
        completion_id = self.new_id("chatcmpl")
        if not body.get("stream"):
            assert isinstance(entry, Reply)
            return web.json_response(
                self._completion(entry, body["model"], completion_id),
                headers=self.response_headers(),
            )
        if isinstance(entry, Fail):
            error = {"error": self._error_object(entry.status, entry.message, entry.error_type)}
            return await self._play(request, Reply(), iter([(_sse(None, error), False)]))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self._play(
            request, entry, self._chunks(entry, body["model"], completion_id, usage)
        )

    def _completion(self, reply: Reply, model: str, completion_id: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_fake_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.argument_text()},
                }
                for i, call in enumerate(reply.tool_calls)
            ]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _CHAT_FINISH.get(reply.stop, reply.stop),
                }
            ],
            "usage": _chat_usage(reply),
        }

    def _chunks(
        self, reply: Reply, model: str, completion_id: str, usage: bool
    ) -> Iterator[_Event]:
        created = int(time.time())

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [] if delta is None else [choice],
            }
            if usage:
                data["usage"] = None
            return _sse(None, {**data, **extra})

        yield chunk({"role": "assistant", "content": ""}), False
        for piece in reply.text_chunks():
            yield chunk({"content": piece}), True
        for i, call in enumerate(reply.tool_calls):
            first = {
                "index": i,
                "id": call.id or f"call_{completion_id}_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [first]}), False
            for piece in reply.argument_chunks(call):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), True
        yield chunk({}, _CHAT_FINISH.get(reply.stop, reply.stop)), False
        if usage:  # the last chunk has the usage and no choices
            yield chunk(None, usage=_chat_usage(reply)), False
        yield _sse(None, "[DONE]"), False

    # --- Responses ---

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        begun = await self._begin(request, _check_responses)
        if isinstance(begun, web.Response):
            return begun
        body, entry = begun
        response_id = self.new_id("resp")
        if not body.get("stream"):
            assert isinstance(entry, Reply)
            return web.json_response(
                self._response(entry, body, response_id, self._output(entry, response_id)),
                headers=self.response_headers(),
            )
        if isinstance(entry, Fail):
            failed = self._response(Reply(), body, response_id, [], status="failed")
            failed["error"] = {"code": entry.error_type or "server_error", "message": entry.message}
            started = self._response(Reply(), body, response_id, [], status="in_progress")
            events = [
                _typed("response.created", sequence_number=0, response=started),
                _typed("response.failed", sequence_number=1, response=failed),
            ]
            return await self._play(request, Reply(), iter(events))
        return await self._play(request, entry, self._stream(entry, body, response_id))

    def _output(self, reply: Reply, response_id: str) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        if reply.text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{response_id}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "output_text",
                            "text": reply.text,
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        for i, call in enumerate(reply.tool_calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{response_id}_{i}",
                    "call_id": call.id or f"call_{response_id}_{i}",
                    "name": call.name,
                    "arguments": call.argument_text(),
                    "status": "completed",
                }
            )
        return output

    def _response(
        self,
        reply: Reply,
        body: dict[str, Any],
        response_id: str,
        output: list[dict[str, Any]],
        status: str | None = None,
    ) -> dict[str, Any]:
        incomplete = reply.stop == "max_tokens"
        final = status is None
        status = status or ("incomplete" if incomplete else "completed")
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if final and incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body["model"],
            "output": output,
            "parallel_tool_calls": True,
            "temperature": body.get("temperature", 1.0),
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "top_p": 1.0,
            "store": body.get("store", True),
            "metadata": {},
            "usage": {
                "input_tokens": reply.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": reply.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": reply.input_tokens + reply.output_tokens,
            }
            if final
            else None,
        }

    def _stream(self, reply: Reply, body: dict[str, Any], response_id: str) -> Iterator[_Event]:
        numbers = itertools.count()

        def event(kind: str, content: bool = False, **fields: Any) -> _Event:
            return _sse(kind, {"type": kind, "sequence_number": next(numbers), **fields}), content

        begun = self._response(reply, body, response_id, [], status="in_progress")
        yield event("response.created", response=begun)
        yield event("response.in_progress", response=begun)
        output = self._output(reply, response_id)
        for index, item in enumerate(output):
            if item["type"] == "message":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                yield event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
                for piece in reply.text_chunks():
                    yield event(
                        "response.output_text.delta",
                        True,
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                yield event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=reply.text,
                    logprobs=[],
                )
                yield event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            else:
                call = reply.tool_calls[index - (1 if reply.text else 0)]
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                for piece in reply.argument_chunks(call):
                    yield event(
                        "response.function_call_arguments.delta",
                        True,
                        item_id=item["id"],
                        output_index=index,
                        delta=piece,
                    )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            yield event("response.output_item.done", output_index=index, item=item)
        final = self._response(reply, body, response_id, output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield event(kind, response=final)


def _chat_usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _check_common(body: dict[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _Rejected("you must provide a model parameter")


def _check_tool_schema(name: str, schema: Any) -> None:
    """As both providers do: a tool's parameters are a JSON Schema of an object, whose
    properties are schemas too."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise _Rejected(f"tools: the schema of {name!r} must be a JSON Schema of type 'object'")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict) for p in properties.values()
    ):
        raise _Rejected(f"tools: the properties of {name!r} must be JSON Schemas")


def _check_chat(body: dict[str, Any]) -> None:
    _check_common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Rejected("'messages' must contain at least one message")
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not (tool.get("function") or {}).get("name"):
            raise _Rejected("tools: each tool needs type 'function' and function.name")
        _check_tool_schema(tool["function"]["name"], tool["function"].get("parameters"))
    pending: set[str] = set()
    for n, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise _Rejected(
                    f"messages.[{n}]: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'"
                )
            pending.discard(call_id)
            continue
        if pending:
            raise _Rejected(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'. Missing: {sorted(pending)}"
            )
        if role not in ("system", "developer", "user", "assistant"):
            raise _Rejected(f"messages.[{n}].role: invalid role {role!r}")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                arguments = (call.get("function") or {}).get("arguments")
                if not isinstance(arguments, str):
                    raise _Rejected(f"messages.[{n}].tool_calls: arguments must be a string")
                pending.add(call.get("id"))
    if pending:
        raise _Rejected(f"tool calls without tool messages: {sorted(pending)}")


def _check_responses(body: dict[str, Any]) -> None:
    _check_common(body)
    inputs = body.get("input")
    if isinstance(inputs, str):
        return
    if not isinstance(inputs, list) or not inputs:
        raise _Rejected("input: a string or a non-empty list of items")
    for tool in body.get("tools") or []:
        if tool.get("type") == "function" and not tool.get("name"):
            raise _Rejected("tools: a function tool needs a name")
        if tool.get("type") == "function":
            _check_tool_schema(tool["name"], tool.get("parameters"))
    calls: set[str] = set()
    answered: set[str] = set()
    for n, item in enumerate(inputs):
        kind = item.get("type", "message")
        if kind == "function_call":
            if not isinstance(item.get("arguments"), str):
                raise _Rejected(f"input[{n}].arguments: must be a string")
            calls.add(item.get("call_id"))
        elif kind == "function_call_output":
            if item.get("call_id") not in calls:
                raise _Rejected(
                    f"No tool call found for function call output with call_id "
                    f"{item.get('call_id')}."
                )
            answered.add(item.get("call_id"))
        elif kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                raise _Rejected(f"input[{n}].role: invalid role")
        else:
            raise _Rejected(f"input[{n}].type: unknown item type {kind!r}")
    missing = calls - answered
    if missing:
        raise _Rejected(f"No tool output found for function call {sorted(missing)[0]}.")

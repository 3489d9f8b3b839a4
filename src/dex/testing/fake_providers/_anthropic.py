"""The Anthropic Messages API: ``POST /v1/messages``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from aiohttp import web

from dex.testing.fake_providers._script import Fail, Reply, ScriptedCall
from dex.testing.fake_providers._server import (
    Endpoint,
    Event,
    FakeProvider,
    Rejected,
    check_tool_schema,
    sse,
    typed,
)

_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class Messages(Endpoint):
    path = "/v1/messages"
    id_prefix = "msg"
    no_model = "model: Field required"

    def answer(self, reply: Reply, body: dict[str, Any], ident: str) -> dict[str, Any]:
        return _message(reply, body["model"], ident)

    def broken(
        self, fail: Fail, body: dict[str, Any], ident: str, error: dict[str, Any]
    ) -> Iterable[Event]:
        started = _message(Reply(), body["model"], ident, start=True)
        return [typed("message_start", message=started), (sse("error", error), False)]

    def stream(self, reply: Reply, body: dict[str, Any], ident: str) -> Iterator[Event]:
        yield typed("message_start", message=_message(reply, body["model"], ident, start=True))
        yield typed("ping")
        index = 0
        if reply.text:
            text_block = {"type": "text", "text": ""}
            yield typed("content_block_start", index=index, content_block=text_block)
            for piece in reply.text_chunks():
                delta = {"type": "text_delta", "text": piece}
                yield typed("content_block_delta", True, index=index, delta=delta)
            yield typed("content_block_stop", index=index)
            index += 1
        for i, call in enumerate(reply.tool_calls):
            block = _tool_use(call, call.id or f"toolu_fake_{ident}_{i}", {})
            yield typed("content_block_start", index=index, content_block=block)
            for piece in reply.argument_chunks(call) or [""]:
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield typed("content_block_delta", bool(piece), index=index, delta=delta)
            yield typed("content_block_stop", index=index)
            index += 1
        stop = {"stop_reason": reply.stop, "stop_sequence": None}
        yield typed("message_delta", delta=stop, usage={"output_tokens": reply.output_tokens})
        yield typed("message_stop")

    def check(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            raise Rejected("max_tokens: Field required")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Rejected("messages: at least one message is required")
        for tool in body.get("tools") or []:
            if not tool.get("name") or not isinstance(tool.get("input_schema"), dict):
                raise Rejected("tools: each tool needs a name and an input_schema")
            check_tool_schema(tool["name"], tool["input_schema"])
        if messages[0].get("role") != "user":
            raise Rejected("messages: the first message must use the user role")
        expected: set[str] = set()  # tool_use ids of the previous assistant message
        for n, message in enumerate(messages):
            role = message.get("role")
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if role not in ("user", "assistant") or not isinstance(blocks, list):
                raise Rejected(f"messages.{n}: a role of user or assistant and a content")
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            if expected:
                leading = [
                    b.get("tool_use_id")
                    for b in itertools.takewhile(lambda b: b.get("type") == "tool_result", blocks)
                ]
                if role != "user" or set(leading) != expected or len(leading) != len(results):
                    raise Rejected(
                        f"messages.{n}: `tool_use` ids were found without `tool_result` blocks "
                        f"immediately after: {sorted(expected - set(leading))}; each `tool_use` "
                        "block must have a corresponding `tool_result` block in the next message, "
                        "and tool_result blocks must come first"
                    )
            elif results:
                raise Rejected(
                    f"messages.{n}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{results}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message."
                )
            expected = set()
            for b in blocks:
                kind = b.get("type")
                if kind == "text" and not b.get("text"):
                    raise Rejected(f"messages.{n}: text content blocks must be non-empty")
                if kind == "tool_use":
                    if role != "assistant":
                        raise Rejected(f"messages.{n}: tool_use blocks belong to the assistant")
                    if not isinstance(b.get("input"), dict):
                        raise Rejected(f"messages.{n}: tool_use.input: Input should be an object")
                    expected.add(b.get("id"))
        if expected:
            raise Rejected("the last message has `tool_use` blocks without `tool_result` blocks")


class FakeAnthropic(FakeProvider):
    """``POST /v1/messages``; the SDK's ``base_url`` is ``server.base_url``."""

    endpoints = (Messages(),)

    def admit(self, request: web.Request) -> web.Response | None:
        if self.api_key is not None and self.api_key not in (
            request.headers.get("x-api-key"),
            request.headers.get("authorization", "").removeprefix("Bearer "),
        ):  # SDK versions send the key as x-api-key or as a bearer token
            return self.error(401, "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            raise Rejected("anthropic-version: header is required")
        return None

    def error_body(self, status: int, message: str, error_type: str | None) -> dict[str, Any]:
        kind = error_type or _ERRORS.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def response_headers(self) -> dict[str, str]:
        return {"request-id": self.new_id("req")}


def _message(reply: Reply, model: str, ident: str, *, start: bool = False) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if not start:
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for i, call in enumerate(reply.tool_calls):
            try:
                arguments = json.loads(call.argument_text())
            except ValueError:
                arguments = {}
            content.append(_tool_use(call, call.id or f"toolu_fake_{i}", arguments))
    return {
        "id": ident,
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


def _tool_use(call: ScriptedCall, ident: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": ident, "name": call.name, "input": arguments}

"""The OpenAI Chat Completions API: ``POST /v1/chat/completions``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from dex.testing.fake_providers._script import Fail, Reply
from dex.testing.fake_providers._server import Endpoint, Event, Rejected, check_tool_schema, sse

_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


class ChatCompletions(Endpoint):
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl"
    no_model = "you must provide a model parameter"

    def answer(self, reply: Reply, body: dict[str, Any], ident: str) -> dict[str, Any]:
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
            "id": ident,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _FINISH.get(reply.stop, reply.stop),
                }
            ],
            "usage": _usage(reply),
        }

    def broken(
        self, fail: Fail, body: dict[str, Any], ident: str, error: dict[str, Any]
    ) -> Iterable[Event]:
        return [(sse(None, error), False)]

    def stream(self, reply: Reply, body: dict[str, Any], ident: str) -> Iterator[Event]:
        created = int(time.time())
        usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            data: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body["model"],
                "system_fingerprint": None,
                "choices": [] if delta is None else [choice],
            }
            if usage:
                data["usage"] = None
            return sse(None, {**data, **extra})

        yield chunk({"role": "assistant", "content": ""}), False
        for piece in reply.text_chunks():
            yield chunk({"content": piece}), True
        for i, call in enumerate(reply.tool_calls):
            first = {
                "index": i,
                "id": call.id or f"call_{ident}_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [first]}), False
            for piece in reply.argument_chunks(call):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), True
        yield chunk({}, _FINISH.get(reply.stop, reply.stop)), False
        if usage:  # the last chunk has the usage and no choices
            yield chunk(None, usage=_usage(reply)), False
        yield sse(None, "[DONE]"), False

    def check(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Rejected("'messages' must contain at least one message")
        for tool in body.get("tools") or []:
            if tool.get("type") != "function" or not (tool.get("function") or {}).get("name"):
                raise Rejected("tools: each tool needs type 'function' and function.name")
            check_tool_schema(tool["function"]["name"], tool["function"].get("parameters"))
        pending: set[str] = set()
        for n, message in enumerate(messages):
            role = message.get("role")
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in pending:
                    raise Rejected(
                        f"messages.[{n}]: messages with role 'tool' must be a response to a "
                        "preceding message with 'tool_calls'"
                    )
                pending.discard(call_id)
                continue
            if pending:
                raise Rejected(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'. Missing: {sorted(pending)}"
                )
            if role not in ("system", "developer", "user", "assistant"):
                raise Rejected(f"messages.[{n}].role: invalid role {role!r}")
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    arguments = (call.get("function") or {}).get("arguments")
                    if not isinstance(arguments, str):
                        raise Rejected(f"messages.[{n}].tool_calls: arguments must be a string")
                    pending.add(call.get("id"))
        if pending:
            raise Rejected(f"tool calls without tool messages: {sorted(pending)}")


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }

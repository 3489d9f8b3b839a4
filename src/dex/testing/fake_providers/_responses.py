"""The OpenAI Responses API: ``POST /v1/responses``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

from dex.testing.fake_providers._script import Fail, Reply
from dex.testing.fake_providers._server import Endpoint, Event, Rejected, check_tool_schema, typed


class Responses(Endpoint):
    path = "/v1/responses"
    id_prefix = "resp"
    no_model = "you must provide a model parameter"

    def answer(self, reply: Reply, body: dict[str, Any], ident: str) -> dict[str, Any]:
        return _response(reply, body, ident, _output(reply, ident))

    def broken(
        self, fail: Fail, body: dict[str, Any], ident: str, error: dict[str, Any]
    ) -> Iterable[Event]:
        failed = _response(Reply(), body, ident, [], status="failed")
        failed["error"] = {"code": fail.error_type or "server_error", "message": fail.message}
        started = _response(Reply(), body, ident, [], status="in_progress")
        return [
            typed("response.created", sequence_number=0, response=started),
            typed("response.failed", sequence_number=1, response=failed),
        ]

    def stream(self, reply: Reply, body: dict[str, Any], ident: str) -> Iterator[Event]:
        numbers = itertools.count()

        def event(kind: str, content: bool = False, **fields: Any) -> Event:
            return typed(kind, content, sequence_number=next(numbers), **fields)

        begun = _response(reply, body, ident, [], status="in_progress")
        yield event("response.created", response=begun)
        yield event("response.in_progress", response=begun)
        output = _output(reply, ident)
        for index, item in enumerate(output):
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                yield event("response.content_part.added", **at, content_index=0, part=part)
                for piece in reply.text_chunks():
                    yield event(
                        "response.output_text.delta",
                        True,
                        **at,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                yield event(
                    "response.output_text.done",
                    **at,
                    content_index=0,
                    text=reply.text,
                    logprobs=[],
                )
                done = item["content"][0]
                yield event("response.content_part.done", **at, content_index=0, part=done)
            else:
                call = reply.tool_calls[index - (1 if reply.text else 0)]
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                for piece in reply.argument_chunks(call):
                    yield event("response.function_call_arguments.delta", True, **at, delta=piece)
                arguments = item["arguments"]
                yield event("response.function_call_arguments.done", **at, arguments=arguments)
            yield event("response.output_item.done", output_index=index, item=item)
        final = _response(reply, body, ident, output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield event(kind, response=final)

    def check(self, body: dict[str, Any]) -> None:
        inputs = body.get("input")
        if isinstance(inputs, str):
            return
        if not isinstance(inputs, list) or not inputs:
            raise Rejected("input: a string or a non-empty list of items")
        for tool in body.get("tools") or []:
            if tool.get("type") == "function" and not tool.get("name"):
                raise Rejected("tools: a function tool needs a name")
            if tool.get("type") == "function":
                check_tool_schema(tool["name"], tool.get("parameters"))
        calls: set[str] = set()
        answered: set[str] = set()
        for n, item in enumerate(inputs):
            kind = item.get("type", "message")
            if kind == "function_call":
                if not isinstance(item.get("arguments"), str):
                    raise Rejected(f"input[{n}].arguments: must be a string")
                calls.add(item.get("call_id"))
            elif kind == "function_call_output":
                if item.get("call_id") not in calls:
                    raise Rejected(
                        f"No tool call found for function call output with call_id "
                        f"{item.get('call_id')}."
                    )
                answered.add(item.get("call_id"))
            elif kind == "message":
                if item.get("role") not in ("user", "assistant", "system", "developer"):
                    raise Rejected(f"input[{n}].role: invalid role")
            else:
                raise Rejected(f"input[{n}].type: unknown item type {kind!r}")
        missing = calls - answered
        if missing:
            raise Rejected(f"No tool output found for function call {sorted(missing)[0]}.")


def _output(reply: Reply, response_id: str) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if reply.text:
        text = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
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

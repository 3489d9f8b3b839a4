"""OpenAI models through the official ``openai`` SDK, streamed: the Responses API
(``api="responses"``, the default) or Chat Completions (``api="chat"``), and any
OpenAI-compatible server by ``base_url`` (vLLM, Ollama, a LiteLLM proxy; these mostly
speak Chat Completions).

    from dex.models import OpenAI
    model = OpenAI(model="gpt-4.1")
    local = OpenAI(model="llama3.1", api="chat", base_url="http://localhost:11434/v1")

The key comes from ``OPENAI_API_KEY`` in the Worker's environment, or ``api_key=``; it
is never part of ``spec()``. See docs/models.md for what is retried and recorded.
"""

from __future__ import annotations

import json
import secrets
import typing
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

try:
    import openai
    from openai._models import construct_type  # how the SDK builds its stream events
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "dex.models.OpenAI needs the OpenAI SDK: pip install 'dex-runtime[openai]'"
    ) from e
from pydantic import BaseModel

from dex.models import _translate as tr
from dex.models._sdk import SDKModel
from dex.models.base import ModelError, ModelRequest
from dex.wire import ModelResponse, ModelToolCall, Usage

PROVIDER = "openai"

_CHAT_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}
_INCOMPLETE_STOP = {"max_output_tokens": "max_tokens"}
_RETRYABLE_RESPONSE_CODES = frozenset(
    {"server_error", "rate_limit_exceeded", "vector_store_timeout"}
)


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    arguments: str | None = None
    """The complete argument text when the server sent it at the end (Responses)."""

    def tool_call(self) -> ModelToolCall:
        raw = self.arguments if self.arguments is not None else "".join(self.parts)
        return ModelToolCall(
            id=self.id or f"call_{secrets.token_hex(12)}",
            name=self.name,
            arguments=tr.decode_arguments(raw),
        )


class OpenAI(SDKModel[openai.AsyncOpenAI]):
    """An OpenAI (or OpenAI-compatible) model.

    ``max_output_tokens`` caps each response (``max_output_tokens`` on Responses,
    ``max_completion_tokens`` on Chat Completions; send ``params={"max_tokens": n}`` to a
    server that knows only the old name). ``timeout`` is the SDK's timeout in seconds for
    connecting and for each read of the stream. ``params`` are extra request fields sent
    as they are. ``store`` (Responses) lets OpenAI keep the response; off by default,
    since the session's history lives in Dex. ``stream_usage`` (Chat) asks for token
    usage at the end of the stream; turn it off for a server that refuses
    ``stream_options``.
    """

    provider = PROVIDER
    key_variable = "OPENAI_API_KEY"

    def __init__(
        self,
        model: str,
        *,
        api: Literal["responses", "chat"] = "responses",
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
        store: bool = False,
        stream_usage: bool = True,
        params: Mapping[str, Any] | None = None,
        group: str | None = None,
    ) -> None:
        super().__init__(
            model, api_key=api_key, base_url=base_url, timeout=timeout, params=params, group=group
        )
        if api not in ("responses", "chat"):
            raise ValueError("api must be 'responses' or 'chat'")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError("max_output_tokens must be at least 1")
        self.api = api
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.store = store
        self.stream_usage = stream_usage

    def warm_up(self) -> None:
        """The SDK builds the pydantic schemas of its stream events on first use: over a
        second for the Responses API, all of it blocking the event loop. Build them now."""
        events: Any = ResponseStreamEvent if self.api == "responses" else ChatCompletionChunk
        for variant in _variants(events):
            kind = variant.model_fields.get("type")
            literal = typing.get_args(kind.annotation)[0] if kind is not None else None
            construct_type(type_=events, value={"type": literal} if literal else {})

    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"api": self.api}
        if self.max_output_tokens is not None:
            settings["max_output_tokens"] = self.max_output_tokens
        if self.temperature is not None:
            settings["temperature"] = self.temperature
        if self.api == "responses":
            settings["store"] = self.store
        else:
            settings["stream_usage"] = self.stream_usage
        return settings

    def make_client(self, api_key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=0,  # Dex's retry policy is the only one
            timeout=openai.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
        )

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        if self.api == "responses":
            body["input"] = tr.to_responses(request.history)
            body["store"] = self.store
            if request.instructions:
                body["instructions"] = request.instructions
            if request.tools:
                body["tools"] = tr.responses_tools(request.tools)
            if self.max_output_tokens is not None:
                body["max_output_tokens"] = self.max_output_tokens
        else:
            body["messages"] = tr.to_chat(request.instructions, request.history)
            if request.tools:
                body["tools"] = tr.chat_tools(request.tools)
            if self.max_output_tokens is not None:
                body["max_completion_tokens"] = self.max_output_tokens
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        client = self.client()
        body = self.request_body(request)
        try:
            if self.api == "responses":
                create: Any = client.responses.create
                events = await create(**body, stream=True, extra_body=self.params or None)
                async with events:
                    async for item in _responses(events):
                        yield item
            else:
                create = client.chat.completions.create
                events = await create(**body, stream=True, extra_body=self.params or None)
                async with events:
                    async for item in _chat(events):
                        yield item
        except ModelError:
            raise
        except openai.APIStatusError as e:
            message = _message(e.body) or e.message
            error_type = _field(e.body, "type") or _field(e.body, "code")
            raise tr.http_error(
                PROVIDER,
                e.status_code,
                message,
                e.response.headers,
                error_type=error_type,
                request_id=e.request_id,
            ) from e
        except (openai.APIConnectionError, json.JSONDecodeError) as e:
            raise tr.connection_error(PROVIDER, e) from e
        except openai.APIResponseValidationError as e:
            raise ModelError(f"{PROVIDER}: unexpected response: {e}", retryable=False) from e
        except openai.APIError as e:  # an error object inside a Chat Completions stream
            error_type = _field(e.body, "type") or _field(e.body, "code")
            raise tr.stream_error(PROVIDER, error_type, _message(e.body) or e.message) from e
        except openai.OpenAIError as e:
            raise ModelError(f"{PROVIDER}: {e}", retryable=False, provider=PROVIDER) from e


async def _chat(events: AsyncIterator[Any]) -> AsyncIterator[str | ModelResponse]:
    text: list[str] = []
    calls: dict[int, _Call] = {}
    finish: str | None = None
    usage = Usage()
    async for chunk in events:
        if chunk.usage is not None:
            usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
            )
        for choice in chunk.choices or []:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    text.append(delta.content)
                    yield delta.content
                for part in delta.tool_calls or []:
                    call = calls.setdefault(part.index, _Call())
                    if part.id:
                        call.id = part.id
                    if part.function is not None:
                        if part.function.name:
                            call.name += part.function.name
                        if part.function.arguments:
                            call.parts.append(part.function.arguments)
            if choice.finish_reason:
                finish = choice.finish_reason
    if finish is None:
        raise tr.incomplete_stream(PROVIDER)
    tool_calls = [c.tool_call() for _, c in sorted(calls.items())]
    yield ModelResponse(
        text="".join(text),
        tool_calls=tool_calls,
        stop_reason=tr.tool_use_stop(_CHAT_STOP.get(finish, finish), bool(tool_calls)),
        usage=usage,
    )


async def _responses(events: AsyncIterator[Any]) -> AsyncIterator[str | ModelResponse]:
    text: list[str] = []
    calls: dict[int, _Call] = {}
    final: Any = None
    async for event in events:
        kind = event.type
        if kind == "response.output_text.delta":
            if event.delta:
                text.append(event.delta)
                yield event.delta
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = event.item
            if item.type == "function_call":
                call = calls.setdefault(event.output_index, _Call())
                call.id, call.name = item.call_id, item.name
                if kind == "response.output_item.done":
                    call.arguments = item.arguments
        elif kind == "response.function_call_arguments.delta":
            calls.setdefault(event.output_index, _Call()).parts.append(event.delta)
        elif kind == "response.function_call_arguments.done":
            calls.setdefault(event.output_index, _Call()).arguments = event.arguments
        elif kind in ("response.completed", "response.incomplete"):
            final = event.response
        elif kind == "response.failed":
            error = event.response.error
            code = getattr(error, "code", None)
            raise _response_error(code, getattr(error, "message", None) or "the response failed")
        elif kind == "error":
            raise _response_error(event.code, event.message)
    if final is None:
        raise tr.incomplete_stream(PROVIDER)
    if not text:  # a server that sent no deltas: the text is in the final response
        for item in final.output or []:
            if item.type == "message":
                text.extend(getattr(part, "text", "") or "" for part in item.content)
        if text:
            yield "".join(text)
    if not calls:
        for index, item in enumerate(final.output or []):
            if item.type == "function_call":
                calls[index] = _Call(item.call_id, item.name, arguments=item.arguments)
    tool_calls = [c.tool_call() for _, c in sorted(calls.items())]
    if final.status == "incomplete":
        reason = getattr(final.incomplete_details, "reason", None) or "incomplete"
        stop_reason = _INCOMPLETE_STOP.get(reason, reason)
    else:
        stop_reason = "tool_use" if tool_calls else "end_turn"
    usage = Usage()
    if final.usage is not None:
        usage = Usage(
            input_tokens=final.usage.input_tokens or 0,
            output_tokens=final.usage.output_tokens or 0,
        )
    yield ModelResponse(
        text="".join(text), tool_calls=tool_calls, stop_reason=stop_reason, usage=usage
    )


def _response_error(code: str | None, message: str) -> ModelError:
    """``response.failed`` or an ``error`` event of the Responses API."""
    if code in _RETRYABLE_RESPONSE_CODES or code is None:
        return tr.stream_error(PROVIDER, code, message)
    return ModelError(
        f"{PROVIDER}: error in the stream ({code}, not retryable): {message}",
        retryable=False,
        provider=PROVIDER,
        error_type=code,
    )


def _field(body: object, name: str) -> str | None:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            value = inner.get(name)
            return value if isinstance(value, str) else None
    return None


def _message(body: object) -> str | None:
    return _field(body, "message")


def _variants(union: Any) -> list[type[BaseModel]]:
    """The model classes inside a (possibly annotated, nested) union type."""
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(union) or (union,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            found.append(arg)
        elif typing.get_args(arg):
            found.extend(_variants(arg))
    return found

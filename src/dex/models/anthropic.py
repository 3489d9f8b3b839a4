"""Claude through the official ``anthropic`` SDK (Messages API), streamed.

    from dex.models import Anthropic
    model = Anthropic(model="claude-sonnet-4-5", max_tokens=4096)

The key comes from ``ANTHROPIC_API_KEY`` in the Worker's environment, or ``api_key=``;
it is never part of ``spec()``. See docs/models.md for what is retried and recorded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import anthropic
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "dex.models.Anthropic needs the Anthropic SDK: pip install 'dex-runtime[anthropic]'"
    ) from e

from dex.models import _translate as tr
from dex.models._sdk import SDKModel
from dex.models.base import ModelError, ModelRequest
from dex.wire import ModelResponse, ModelToolCall, Usage

PROVIDER = "anthropic"


@dataclass
class _ToolUse:
    id: str
    name: str
    start: Any = None
    """The input in the block's start event: ``{}`` from the API, all of it from some proxies."""
    parts: list[str] = field(default_factory=list)

    def tool_call(self) -> ModelToolCall:
        if not self.parts and isinstance(self.start, dict) and self.start:
            return ModelToolCall(id=self.id, name=self.name, arguments=self.start)
        return ModelToolCall(
            id=self.id, name=self.name, arguments=tr.decode_arguments("".join(self.parts))
        )


class Anthropic(SDKModel[anthropic.AsyncAnthropic]):
    """A Claude model over the Messages API.

    ``max_tokens`` caps each response (the API requires it). ``timeout`` is the SDK's
    timeout in seconds for connecting and for each read of the stream. ``params`` are
    extra request fields sent as they are (``top_k``, ``metadata``, ...). ``base_url``
    points the SDK elsewhere (a proxy, or a test server).
    """

    provider = PROVIDER
    key_variable = "ANTHROPIC_API_KEY"

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        temperature: float | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
        params: Mapping[str, Any] | None = None,
        group: str | None = None,
    ) -> None:
        super().__init__(
            model, api_key=api_key, base_url=base_url, timeout=timeout, params=params, group=group
        )
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.max_tokens = max_tokens
        self.temperature = temperature

    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.temperature is not None:
            settings["temperature"] = self.temperature
        return settings

    def make_client(self, api_key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=0,  # Dex's retry policy is the only one
            timeout=anthropic.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
        )

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": tr.to_anthropic(request.history),
        }
        if request.instructions:
            body["system"] = request.instructions
        if request.tools:
            body["tools"] = tr.anthropic_tools(request.tools)
        return body

    def extra_body(self) -> dict[str, Any] | None:
        """Fields sent past the SDK's own arguments, which change between SDK versions."""
        extra = dict(self.params)
        if self.temperature is not None:
            extra.setdefault("temperature", self.temperature)
        return extra or None

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        client = self.client()
        create: Any = client.messages.create
        text: list[str] = []
        calls: dict[int, _ToolUse] = {}
        stop_reason: str | None = None
        usage = Usage()
        done = False
        try:
            events = await create(
                **self.request_body(request), stream=True, extra_body=self.extra_body()
            )
            async with events:
                async for event in events:
                    kind = event.type
                    if kind == "message_start":
                        usage = _usage(event.message.usage, usage)
                    elif kind == "content_block_start":
                        block = event.content_block
                        if block.type == "tool_use":
                            calls[event.index] = _ToolUse(block.id, block.name, block.input)
                        elif block.type == "text" and block.text:
                            text.append(block.text)
                            yield block.text
                    elif kind == "content_block_delta":
                        delta = event.delta
                        if delta.type == "text_delta" and delta.text:
                            text.append(delta.text)
                            yield delta.text
                        elif delta.type == "input_json_delta" and event.index in calls:
                            calls[event.index].parts.append(delta.partial_json)
                    elif kind == "message_delta":
                        stop_reason = event.delta.stop_reason or stop_reason
                        usage = _usage(event.usage, usage)
                    elif kind == "message_stop":
                        done = True
        except ModelError:
            raise
        except anthropic.APIStatusError as e:
            message = e.api_message or e.message
            if e.status_code < 400:  # an ``error`` event inside a stream that began with 200
                raise tr.stream_error(PROVIDER, e.type, message) from e
            raise tr.http_error(
                PROVIDER,
                e.status_code,
                message,
                e.response.headers,
                error_type=e.type,
                request_id=e.request_id,
            ) from e
        except anthropic.APIResponseValidationError as e:
            raise ModelError(f"{PROVIDER}: unexpected response: {e}", retryable=False) from e
        except (anthropic.APIConnectionError, json.JSONDecodeError) as e:
            raise tr.connection_error(PROVIDER, e) from e
        except anthropic.AnthropicError as e:
            raise ModelError(f"{PROVIDER}: {e}", retryable=False, provider=PROVIDER) from e
        except Exception as e:
            if _transport_error(e):
                raise tr.connection_error(PROVIDER, e) from e
            raise
        if not done:
            raise tr.incomplete_stream(PROVIDER)
        tool_calls = [c.tool_call() for _, c in sorted(calls.items())]
        yield ModelResponse(
            text="".join(text),
            tool_calls=tool_calls,
            stop_reason=tr.tool_use_stop(stop_reason or "end_turn", bool(tool_calls)),
            usage=usage,
        )


def _usage(reported: Any, so_far: Usage) -> Usage:
    """Anthropic reports cumulative counts; the input is uncached + cache writes + cache reads."""
    if reported is None:
        return so_far
    input_tokens = so_far.input_tokens
    if getattr(reported, "input_tokens", None) is not None:
        input_tokens = (
            reported.input_tokens
            + (getattr(reported, "cache_creation_input_tokens", None) or 0)
            + (getattr(reported, "cache_read_input_tokens", None) or 0)
        )
    output_tokens = getattr(reported, "output_tokens", None)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=so_far.output_tokens if output_tokens is None else output_tokens,
    )


def _transport_error(error: BaseException) -> bool:
    """An error of the SDK's HTTP library (httpx or its fork httpx2) while reading the
    stream, which this SDK does not wrap: the connection dropped or timed out."""
    return any(
        cls.__name__ in ("TransportError", "StreamError") and cls.__module__.startswith("httpx")
        for cls in type(error).__mro__
    )

"""Provider-neutral history <-> provider wire formats, and provider errors -> ``ModelError``.

Pure functions with no SDK imports, shared by ``dex.models.anthropic`` and
``dex.models.openai``. Each ``to_*`` function has a ``from_*`` inverse: a history that
Dex wrote comes back item for item, which is what lets a session switch provider
between turns (the session's history is the source of truth, never the provider's).

The choices, documented in docs/models.md:

- A tool result reaches the model as text. ``succeeded``: the result as JSON (a string
  result is a JSON string, so it can never be mistaken for a status). Anything else:
  ``"<status>: <error>"``, e.g. ``"outcome_unknown: the tool may have run ..."``; Anthropic
  also gets ``is_error: true``.
- Notes and summaries become user text that starts with ``[note]`` / ``[summary]``.
- A tool call whose argument JSON the model garbled becomes a call whose arguments are
  ``{"_invalid_json_arguments": "<the raw text>"}``. No tool can have a parameter
  named so (a leading underscore), so the tool's argument validation fails, the call
  records ``failed`` and the model sees why and may call again.
- A tool call with no result in the history (its turn was cancelled) gets a synthetic
  ``outcome_unknown`` result, because every provider refuses a call without a result.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dex.models.base import ModelError, RateLimited
from dex.wire import (
    AssistantItem,
    Item,
    ModelToolCall,
    NoteItem,
    SummaryItem,
    ToolCallStatus,
    ToolResultItem,
    ToolSpec,
    UserItem,
)

INVALID_ARGUMENTS_KEY = "_invalid_json_arguments"
"""The one argument of a tool call whose argument text was not a JSON object."""

NOTE_PREFIX = "[note] "
SUMMARY_PREFIX = "[summary] "
MISSING_RESULT = (
    "no result was recorded for this call (its turn ended before the call finished); "
    "it may or may not have run"
)

# --- arguments and results -----------------------------------------------------------


def decode_arguments(raw: str | None) -> dict[str, Any]:
    """A model's argument text as a dict; never raises (see the module docstring)."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {INVALID_ARGUMENTS_KEY: raw}
    if not isinstance(value, dict):
        return {INVALID_ARGUMENTS_KEY: raw}
    return value


def encode_arguments(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def result_text(item: ToolResultItem) -> str:
    """What the model reads for a tool result."""
    if item.status == ToolCallStatus.SUCCEEDED:
        return json.dumps(item.result, ensure_ascii=False, default=str)
    if item.error is None:
        return item.status.value
    return f"{item.status.value}: {item.error}"


def is_error(item: ToolResultItem) -> bool:
    return item.status != ToolCallStatus.SUCCEEDED


_STATUSES = [s for s in ToolCallStatus if s != ToolCallStatus.SUCCEEDED]


def parse_result_text(text: str, *, error: bool = False) -> tuple[ToolCallStatus, Any, str | None]:
    """The inverse of ``result_text``: (status, result, error)."""
    for status in _STATUSES:
        if text == status.value:
            return status, None, None
        if text.startswith(status.value + ": "):
            return status, None, text[len(status.value) + 2 :]
    if error:
        return ToolCallStatus.FAILED, None, text
    try:
        return ToolCallStatus.SUCCEEDED, json.loads(text), None
    except ValueError:
        return ToolCallStatus.SUCCEEDED, text, None


def context_text(item: NoteItem | SummaryItem) -> str:
    return (NOTE_PREFIX if isinstance(item, NoteItem) else SUMMARY_PREFIX) + item.text


def user_text(item: UserItem | NoteItem | SummaryItem) -> str:
    """The text of the user message that stands for ``item`` (``parse_user_text`` reads
    it back)."""
    return item.text if isinstance(item, UserItem) else context_text(item)


def parse_user_text(text: str) -> UserItem | NoteItem | SummaryItem:
    if text.startswith(NOTE_PREFIX):
        return NoteItem(text=text.removeprefix(NOTE_PREFIX))
    if text.startswith(SUMMARY_PREFIX):
        return SummaryItem(text=text.removeprefix(SUMMARY_PREFIX))
    return UserItem(text=text)


# --- pairing calls with results ----------------------------------------------------


def paired(history: Iterable[Item]) -> list[Item]:
    """The history with every tool call's result right after the call's assistant item.

    Providers refuse a call without a result and a result without its call. A missing
    result becomes an ``outcome_unknown`` result; a result whose call is not the latest
    assistant item's becomes a note after that item's results.
    """
    out: list[Item] = []
    pending: dict[str, ModelToolCall] = {}
    orphans: list[Item] = []

    def flush() -> None:
        for call in pending.values():
            out.append(
                ToolResultItem(
                    call_id=call.id,
                    name=call.name,
                    status=ToolCallStatus.OUTCOME_UNKNOWN,
                    error=MISSING_RESULT,
                )
            )
        pending.clear()
        out.extend(orphans)
        orphans.clear()

    for item in history:
        if isinstance(item, ToolResultItem):
            if pending.pop(item.call_id, None) is not None:
                out.append(item)
            else:
                orphans.append(
                    NoteItem(
                        text=f"result of tool call {item.call_id} ({item.name}), whose call "
                        f"is no longer in the conversation: {result_text(item)}"
                    )
                )
            continue
        flush()
        out.append(item)
        if isinstance(item, AssistantItem):
            pending = {call.id: call for call in item.tool_calls}
    flush()
    return out


def _result(items: list[Item], call_id: str, text: str, *, error: bool = False) -> ToolResultItem:
    """A provider's tool result read back; it names only the call id, so the tool's name
    comes from the latest call with that id."""
    name = next(
        (
            call.name
            for item in reversed(items)
            if isinstance(item, AssistantItem)
            for call in item.tool_calls
            if call.id == call_id
        ),
        "",
    )
    status, result, message = parse_result_text(text, error=error)
    return ToolResultItem(call_id=call_id, name=name, status=status, result=result, error=message)


# --- Anthropic Messages --------------------------------------------------------------

_ANTHROPIC_ID = re.compile(r"[^a-zA-Z0-9_-]")


def anthropic_id(call_id: str) -> str:
    """Anthropic accepts tool_use ids of ``[a-zA-Z0-9_-]+`` only; others (from another
    provider) are mapped, the same way for the call and its result."""
    return _ANTHROPIC_ID.sub("_", call_id) or "call"


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


def to_anthropic(history: Iterable[Item]) -> list[dict[str, Any]]:
    """The ``messages`` of a Messages API request (the instructions go in ``system``)."""
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for item in paired(history):
        if isinstance(item, UserItem):
            add("user", [{"type": "text", "text": item.text}] if item.text else [])
        elif isinstance(item, NoteItem | SummaryItem):
            add("user", [{"type": "text", "text": context_text(item)}])
        elif isinstance(item, AssistantItem):
            blocks: list[dict[str, Any]] = []
            if item.text:
                blocks.append({"type": "text", "text": item.text})
            for call in item.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": anthropic_id(call.id),
                        "name": call.name,
                        "input": call.arguments,
                    }
                )
            add("assistant", blocks)
        else:
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": anthropic_id(item.call_id),
                "content": result_text(item),
            }
            if is_error(item):
                block["is_error"] = True
            add("user", [block])
    return messages


def from_anthropic(messages: Iterable[dict[str, Any]]) -> list[Item]:
    """The inverse of ``to_anthropic``."""
    items: list[Item] = []
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if message["role"] == "assistant":
            text = "".join(b["text"] for b in blocks if b["type"] == "text")
            calls = [
                ModelToolCall(id=b["id"], name=b["name"], arguments=b.get("input") or {})
                for b in blocks
                if b["type"] == "tool_use"
            ]
            items.append(AssistantItem(text=text, tool_calls=calls))
            continue
        for b in blocks:
            if b["type"] == "text":
                items.append(parse_user_text(b["text"]))
            elif b["type"] == "tool_result":
                raw = b.get("content", "")
                if isinstance(raw, list):
                    raw = "".join(part.get("text", "") for part in raw)
                items.append(_result(items, b["tool_use_id"], raw, error=bool(b.get("is_error"))))
    return items


# --- OpenAI Chat Completions ---------------------------------------------------------


def chat_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def to_chat(instructions: str, history: Iterable[Item]) -> list[dict[str, Any]]:
    """The ``messages`` of a Chat Completions request, starting with the instructions."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in paired(history):
        if isinstance(item, UserItem | NoteItem | SummaryItem):
            messages.append({"role": "user", "content": user_text(item)})
        elif isinstance(item, AssistantItem):
            if not item.text and not item.tool_calls:
                continue
            message: dict[str, Any] = {"role": "assistant", "content": item.text or None}
            if item.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": encode_arguments(call.arguments),
                        },
                    }
                    for call in item.tool_calls
                ]
            messages.append(message)
        else:
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": result_text(item)}
            )
    return messages


def from_chat(messages: Iterable[dict[str, Any]]) -> tuple[str, list[Item]]:
    """The inverse of ``to_chat``: (instructions, history)."""
    instructions: list[str] = []
    items: list[Item] = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        if role in ("system", "developer"):
            instructions.append(content or "")
        elif role == "user":
            items.append(parse_user_text(content or ""))
        elif role == "assistant":
            calls = [
                ModelToolCall(
                    id=c["id"],
                    name=c["function"]["name"],
                    arguments=decode_arguments(c["function"].get("arguments")),
                )
                for c in message.get("tool_calls") or []
            ]
            items.append(AssistantItem(text=content or "", tool_calls=calls))
        elif role == "tool":
            items.append(_result(items, message["tool_call_id"], content or ""))
    return "\n".join(instructions), items


# --- OpenAI Responses ----------------------------------------------------------------


def responses_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    # strict mode needs schemas that Dex's argument schemas need not meet
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in tools
    ]


def to_responses(history: Iterable[Item]) -> list[dict[str, Any]]:
    """The ``input`` items of a Responses request (the instructions go in ``instructions``)."""
    items: list[dict[str, Any]] = []
    for item in paired(history):
        if isinstance(item, UserItem | NoteItem | SummaryItem):
            items.append({"role": "user", "content": user_text(item)})
        elif isinstance(item, AssistantItem):
            if item.text:
                items.append({"role": "assistant", "content": item.text})
            for call in item.tool_calls:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": encode_arguments(call.arguments),
                    }
                )
        else:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": result_text(item),
                }
            )
    return items


def from_responses(inputs: Iterable[dict[str, Any]]) -> list[Item]:
    """The inverse of ``to_responses``."""
    items: list[Item] = []
    for entry in inputs:
        kind = entry.get("type", "message")
        if kind == "message":
            content = entry["content"]
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content)
            if entry["role"] == "assistant":
                items.append(AssistantItem(text=content))
            else:
                items.append(parse_user_text(content))
        elif kind == "function_call":
            call = ModelToolCall(
                id=entry["call_id"],
                name=entry["name"],
                arguments=decode_arguments(entry.get("arguments")),
            )
            last = items[-1] if items else None
            if isinstance(last, AssistantItem):
                last.tool_calls.append(call)
            else:
                items.append(AssistantItem(tool_calls=[call]))
        elif kind == "function_call_output":
            output = entry.get("output", "")
            if isinstance(output, list):
                output = "".join(part.get("text", "") for part in output)
            items.append(_result(items, entry["call_id"], output))
    return items


# --- errors --------------------------------------------------------------------------

RETRYABLE_STATUS = frozenset({408, 409, 429})
"""4xx statuses that may succeed later; every 5xx may too. Other 4xx fail fast."""

FATAL_ERROR_TYPES = frozenset(
    {
        # Anthropic
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
        # OpenAI
        "invalid_prompt",
        "invalid_api_key",
        "context_length_exceeded",
        "model_not_found",
        "invalid_image",
        "bio_policy",
    }
)
"""Error types reported inside a stream that fail fast; any other in-stream error retries."""


def status_retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


RATE_LIMITED_STATUS = frozenset({429, 529})
"""The provider's rate limit (429) or its load (Anthropic's 529 overloaded): nothing ran."""
NOT_RATE_LIMITS = frozenset({"insufficient_quota"})
"""429s that no wait cures (OpenAI's exhausted quota): a failed attempt, as before."""
MAX_RETRY_AFTER = 3600.0


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the provider asks to wait: ``retry-after-ms`` (OpenAI), else ``retry-after``
    in seconds or as an HTTP date; None when it says nothing usable. At most an hour."""
    if not headers:
        return None
    seconds: float | None = None
    ms = headers.get("retry-after-ms")
    value = headers.get("retry-after")
    try:
        if ms is not None:
            seconds = float(ms) / 1000
        elif value is not None:
            seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is None and value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds is None or seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def http_error(
    provider: str,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    **details: Any,
) -> ModelError:
    """An HTTP error status from the provider (``headers``: its response's, for
    ``Retry-After``)."""
    if status in RATE_LIMITED_STATUS and details.get("error_type") not in NOT_RATE_LIMITS:
        wait = retry_after(headers)
        said = f", retry after {wait:g}s" if wait is not None else ""
        return RateLimited(
            f"{provider}: HTTP {status} (rate limited{said}): {message}",
            retry_after=wait,
            provider=provider,
            status=status,
            **details,
        )
    retryable = status_retryable(status)
    verdict = "retryable" if retryable else "not retryable"
    return ModelError(
        f"{provider}: HTTP {status} ({verdict}): {message}",
        retryable=retryable,
        provider=provider,
        status=status,
        **details,
    )


def stream_error(provider: str, error_type: str | None, message: str) -> ModelError:
    """An error the provider reported inside a stream that had started with HTTP 200."""
    retryable = error_type not in FATAL_ERROR_TYPES
    verdict = "retryable" if retryable else "not retryable"
    return ModelError(
        f"{provider}: error in the stream ({error_type or 'unknown'}, {verdict}): {message}",
        retryable=retryable,
        provider=provider,
        error_type=error_type,
    )


def connection_error(provider: str, error: BaseException) -> ModelError:
    """The connection failed, dropped or timed out: another attempt may succeed."""
    return ModelError(
        f"{provider}: connection failed ({type(error).__name__}: {error}); retryable",
        retryable=True,
        provider=provider,
    )


def incomplete_stream(provider: str) -> ModelError:
    return ModelError(
        f"{provider}: the stream ended before the response was complete; retryable",
        retryable=True,
        provider=provider,
    )


def tool_use_stop(stop_reason: str, has_calls: bool) -> str:
    """Some OpenAI-compatible servers say ``stop`` even when they return tool calls."""
    return "tool_use" if has_calls and stop_reason == "end_turn" else stop_reason

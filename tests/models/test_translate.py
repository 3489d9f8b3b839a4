"""The provider-neutral history translates to each provider's format and back without loss."""

from __future__ import annotations

import email.utils
import itertools
import json
import time
from typing import Any

import pytest

from dex.models import RateLimited
from dex.models import _translate as tr
from dex.wire import (
    AssistantItem,
    Item,
    ModelToolCall,
    NoteItem,
    SummaryItem,
    ToolCallStatus,
    ToolResultItem,
    UserItem,
)

HISTORY: list[Item] = [
    SummaryItem(text="Earlier the user asked about Rome."),
    UserItem(text="Weather in Paris and Oslo? Then book a table."),
    AssistantItem(
        text="Checking both.",
        tool_calls=[
            ModelToolCall(id="toolu_01", name="get_weather", arguments={"city": "Paris"}),
            ModelToolCall(id="call_abc", name="get_weather", arguments={"city": "Oslo"}),
        ],
    ),
    ToolResultItem(
        call_id="toolu_01",
        name="get_weather",
        status=ToolCallStatus.SUCCEEDED,
        result={"forecast": "sunny", "high": 21},
    ),
    ToolResultItem(
        call_id="call_abc",
        name="get_weather",
        status=ToolCallStatus.FAILED,
        error="the weather service said 503",
    ),
    AssistantItem(
        tool_calls=[
            ModelToolCall(id="c1", name="book_table", arguments={"people": 2}),
            ModelToolCall(id="c2", name="charge", arguments={"amount": 40}),
            ModelToolCall(id="c3", name="lookup", arguments={"key": "x"}),
            ModelToolCall(
                id="c4", name="get_weather", arguments={tr.INVALID_ARGUMENTS_KEY: '{"city": "Pa'}
            ),
        ]
    ),
    ToolResultItem(
        call_id="c1",
        name="book_table",
        status=ToolCallStatus.OUTCOME_UNKNOWN,
        error="the outcome is unknown: the tool may have run (worker lost); it will not run again",
    ),
    ToolResultItem(
        call_id="c2", name="charge", status=ToolCallStatus.DENIED, error="too expensive"
    ),
    ToolResultItem(
        call_id="c3", name="lookup", status=ToolCallStatus.SUCCEEDED, result="failed: 3 rows"
    ),
    ToolResultItem(
        call_id="c4", name="get_weather", status=ToolCallStatus.FAILED, error="invalid arguments"
    ),
    AssistantItem(text="Paris is sunny; Oslo is unknown. The booking may have gone through."),
    NoteItem(text="The previous turn failed; these tool calls ran: book_table."),
    UserItem(text="Did the booking happen?"),
    AssistantItem(text="Let me answer with nothing.", tool_calls=[]),
    UserItem(text="ok"),
    AssistantItem(tool_calls=[ModelToolCall(id="c5", name="lookup", arguments={})]),
    ToolResultItem(call_id="c5", name="lookup", status=ToolCallStatus.SUCCEEDED, result=None),
]


def test_anthropic_round_trip_is_lossless() -> None:
    messages = tr.to_anthropic(HISTORY)
    assert tr.from_anthropic(messages) == HISTORY


def test_chat_round_trip_is_lossless() -> None:
    messages = tr.to_chat("Be brief.", HISTORY)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    instructions, items = tr.from_chat(messages)
    assert instructions == "Be brief."
    assert items == HISTORY


def test_responses_round_trip_is_lossless() -> None:
    assert tr.from_responses(tr.to_responses(HISTORY)) == HISTORY


@pytest.mark.parametrize(
    ("to", "back"),
    [
        (tr.to_anthropic, tr.from_anthropic),
        (lambda h: tr.to_chat("", h), lambda m: tr.from_chat(m)[1]),
        (tr.to_responses, tr.from_responses),
    ],
)
def test_a_session_can_switch_provider(to: Any, back: Any) -> None:
    """History written while one provider ran reads the same through every other."""
    via_anthropic = tr.from_anthropic(tr.to_anthropic(HISTORY))
    via_chat = tr.from_chat(tr.to_chat("", via_anthropic))[1]
    via_responses = tr.from_responses(tr.to_responses(via_chat))
    assert back(to(via_responses)) == HISTORY


@pytest.mark.parametrize(
    "to",
    [tr.to_anthropic, lambda h: tr.to_chat("", h), tr.to_responses],
    ids=["anthropic", "chat", "responses"],
)
def test_a_framework_adapters_state_never_reaches_a_provider(to: Any) -> None:
    """``AssistantItem.state`` is an adapter's resume data, not conversation: a session that
    switches from an adapter to a plain provider sends the same request as without it."""
    with_state = [
        i.model_copy(update={"state": {"secret": "run state"}})
        if isinstance(i, AssistantItem)
        else i
        for i in HISTORY
    ]
    assert to(with_state) == to(HISTORY)
    assert "run state" not in json.dumps(to(with_state))


def test_tool_results_say_their_status_plainly() -> None:
    messages = tr.to_anthropic(HISTORY)
    results = {
        b["tool_use_id"]: b
        for m in messages
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "tool_result"
    }
    assert results["toolu_01"]["content"] == json.dumps({"forecast": "sunny", "high": 21})
    assert "is_error" not in results["toolu_01"]
    assert results["call_abc"] == {
        "type": "tool_result",
        "tool_use_id": "call_abc",
        "content": "failed: the weather service said 503",
        "is_error": True,
    }
    assert results["c1"]["content"].startswith("outcome_unknown: the outcome is unknown")
    assert results["c1"]["is_error"] is True
    assert results["c2"]["content"] == "denied: too expensive"
    assert results["c2"]["is_error"] is True
    # a string result is JSON, so it cannot pass for a status
    assert results["c3"]["content"] == '"failed: 3 rows"'

    chat = {m["tool_call_id"]: m["content"] for m in tr.to_chat("", HISTORY) if m["role"] == "tool"}
    assert chat["c1"].startswith("outcome_unknown: ")
    assert chat["c2"] == "denied: too expensive"
    outputs = {
        i["call_id"]: i["output"]
        for i in tr.to_responses(HISTORY)
        if i.get("type") == "function_call_output"
    }
    assert outputs["call_abc"] == "failed: the weather service said 503"


def test_notes_and_summaries_are_marked_user_text() -> None:
    chat = tr.to_chat("", HISTORY)
    assert chat[0] == {"role": "user", "content": "[summary] Earlier the user asked about Rome."}
    assert {"role": "user", "content": "[note] " + HISTORY[11].text} in chat  # type: ignore[union-attr]


def test_anthropic_messages_alternate_and_results_come_first() -> None:
    messages = tr.to_anthropic(HISTORY)
    roles = [m["role"] for m in messages]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert roles[0] == "user"
    # the results of the second tool batch, then the assistant text, then note + user merged
    after_tools = messages[4]
    assert [b["type"] for b in after_tools["content"]] == ["tool_result"] * 4


def test_a_call_without_result_gets_an_outcome_unknown_result() -> None:
    history: list[Item] = [
        UserItem(text="charge 5"),
        AssistantItem(tool_calls=[ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]),
        NoteItem(text="The turn was cancelled."),
        UserItem(text="what happened?"),
    ]
    messages = tr.to_anthropic(history)
    result = messages[2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "c1"
    assert result["content"] == f"outcome_unknown: {tr.MISSING_RESULT}"
    chat = tr.to_chat("", history)
    assert chat[2] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": f"outcome_unknown: {tr.MISSING_RESULT}",
    }


def test_a_result_without_its_call_becomes_a_note() -> None:
    history: list[Item] = [
        SummaryItem(text="We charged 5 earlier."),
        ToolResultItem(call_id="gone", name="charge", status=ToolCallStatus.SUCCEEDED, result=1),
        UserItem(text="and now?"),
    ]
    messages = tr.to_anthropic(history)
    assert len(messages) == 1
    texts = [b["text"] for b in messages[0]["content"]]
    assert texts[1].startswith("[note] result of tool call gone (charge)")
    assert [m["role"] for m in tr.to_chat("", history)] == ["user", "user", "user"]
    assert all(i.get("type") != "function_call_output" for i in tr.to_responses(history))


def test_anthropic_ids_are_mapped_to_its_alphabet_for_call_and_result() -> None:
    history: list[Item] = [
        UserItem(text="x"),
        AssistantItem(tool_calls=[ModelToolCall(id="functions.lookup:0", name="lookup")]),
        ToolResultItem(call_id="functions.lookup:0", name="lookup", status="succeeded", result=1),
    ]
    messages = tr.to_anthropic(history)
    assert messages[1]["content"][0]["id"] == "functions_lookup_0"
    assert messages[2]["content"][0]["tool_use_id"] == "functions_lookup_0"


@pytest.mark.parametrize(
    ("raw", "arguments"),
    [
        ('{"city": "Paris"}', {"city": "Paris"}),
        ("", {}),
        (None, {}),
        ('{"city": "Par', {tr.INVALID_ARGUMENTS_KEY: '{"city": "Par'}),
        ("[1, 2]", {tr.INVALID_ARGUMENTS_KEY: "[1, 2]"}),
        ("null", {tr.INVALID_ARGUMENTS_KEY: "null"}),
    ],
)
def test_decode_arguments_never_raises(raw: str | None, arguments: dict[str, Any]) -> None:
    assert tr.decode_arguments(raw) == arguments


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (413, False),
        (422, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (529, True),
    ],
)
def test_http_errors_map_onto_the_retry_policy(status: int, retryable: bool) -> None:
    error = tr.http_error("anthropic", status, "boom")
    assert error.retryable is retryable
    assert f"HTTP {status}" in error.message and "boom" in error.message
    assert error.details["status"] == status


def test_in_stream_errors_retry_unless_the_request_is_at_fault() -> None:
    assert tr.stream_error("anthropic", "overloaded_error", "x").retryable
    assert tr.stream_error("openai", "server_error", "x").retryable
    assert tr.stream_error("openai", None, "x").retryable
    assert not tr.stream_error("anthropic", "invalid_request_error", "x").retryable
    assert not tr.stream_error("openai", "context_length_exceeded", "x").retryable


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # OpenAI's, more precise
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date gone by
        ({"retry-after": "86400"}, 3600.0),  # at most an hour
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_a_429_is_a_rate_limit_that_carries_the_provider_s_retry_after(
    headers: dict[str, str], wait: float | None
) -> None:
    error = tr.http_error("openai", 429, "slow down", headers)
    assert isinstance(error, RateLimited) and error.retryable
    assert error.retry_after == wait
    assert "rate limited" in error.message and "slow down" in error.message


def test_a_retry_after_date_counts_from_now() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    error = tr.http_error("anthropic", 429, "x", {"retry-after": when})
    assert isinstance(error, RateLimited) and error.retry_after is not None
    assert 25 <= error.retry_after <= 31


def test_overloaded_is_a_rate_limit_and_an_exhausted_quota_is_not() -> None:
    assert isinstance(tr.http_error("anthropic", 529, "overloaded"), RateLimited)
    quota = tr.http_error("openai", 429, "no credit", error_type="insufficient_quota")
    assert not isinstance(quota, RateLimited) and quota.retryable  # an attempt, as before
    assert not isinstance(tr.http_error("openai", 503, "down"), RateLimited)

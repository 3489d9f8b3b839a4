"""Each provider's model through the real SDK client against a fake server on loopback,
through the ``Model.stream`` interface."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Annotated, Any

import pytest
from pydantic import Field

import dex
from dex.models import Anthropic, ModelError, OpenAI, RateLimited
from dex.models import _translate as tr
from dex.testing.fake_providers import Entry, Fail, RateLimit, Reply, ScriptedCall
from dex.wire import (
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    ToolCallStatus,
    ToolResultItem,
    Usage,
    UserItem,
)
from tests.models.conftest import Provider, collect, model_request, sent_history


async def test_a_multi_tool_turn(provider: Provider) -> None:
    script = [
        Reply(
            "Let me check both cities.",
            tool_calls=[
                ScriptedCall("get_weather", {"city": "Paris"}, id="call_p"),
                ScriptedCall("get_weather", {"city": "Oslo"}, id="call_o"),
            ],
            input_tokens=40,
            output_tokens=18,
        ),
        Reply("Paris is sunny. Oslo: the lookup failed.", input_tokens=90, output_tokens=11),
    ]
    async with provider.server(script) as server, provider.model(server) as model:
        deltas, first = await collect(model, model_request())
        assert "".join(deltas) == first.text == "Let me check both cities."
        assert first.tool_calls == [
            ModelToolCall(id="call_p", name="get_weather", arguments={"city": "Paris"}),
            ModelToolCall(id="call_o", name="get_weather", arguments={"city": "Oslo"}),
        ]
        assert first.stop_reason == "tool_use"
        assert first.usage == Usage(input_tokens=40, output_tokens=18)

        history: list[Item] = [
            UserItem(text="Weather in Paris?"),
            AssistantItem(text=first.text, tool_calls=first.tool_calls),
            ToolResultItem(
                call_id="call_p", name="get_weather", status="succeeded", result={"sky": "sun"}
            ),
            ToolResultItem(
                call_id="call_o", name="get_weather", status="outcome_unknown", error="lost"
            ),
        ]
        deltas, second = await collect(model, model_request(history))
        assert second.text == "Paris is sunny. Oslo: the lookup failed."
        assert second.tool_calls == [] and second.stop_reason == "end_turn"
        assert second.usage == Usage(input_tokens=90, output_tokens=11)

    assert len(server.requests) == 2
    body = server.requests[1].body
    assert sent_history(provider, body) == history
    assert body["model"] in ("claude-test", "gpt-test")
    assert body["stream"] is True
    if provider.name == "anthropic":
        assert body["system"] == "You answer questions about the weather."
        assert body["tools"][0]["input_schema"]["required"] == ["city"]
        results = body["messages"][2]["content"]
        assert results[1] == {
            "type": "tool_result",
            "tool_use_id": "call_o",
            "content": "outcome_unknown: lost",
            "is_error": True,
        }
    elif provider.name == "openai-chat":
        assert body["messages"][0]["role"] == "system"
        assert body["tools"][0]["function"]["parameters"]["required"] == ["city"]
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"][-1]["content"] == "outcome_unknown: lost"
    else:
        assert body["instructions"] == "You answer questions about the weather."
        assert body["tools"][0]["strict"] is False
        assert body["store"] is False
        assert body["input"][-1]["output"] == "outcome_unknown: lost"


async def test_parallel_tool_calls_keep_their_order_ids_and_arguments(provider: Provider) -> None:
    calls = [
        ScriptedCall("get_weather", {"city": city}, id=f"call_{i}")
        for i, city in enumerate(["Paris", "Oslo", "Lima", "Pune"])
    ]
    async with (
        provider.server([Reply(tool_calls=calls, chunk_chars=3)]) as server,
        provider.model(server) as model,
    ):
        deltas, response = await collect(model, model_request())
    assert deltas == [] and response.text == ""
    assert [(c.id, c.arguments["city"]) for c in response.tool_calls] == [
        ("call_0", "Paris"),
        ("call_1", "Oslo"),
        ("call_2", "Lima"),
        ("call_3", "Pune"),
    ]
    assert response.stop_reason == "tool_use"


async def test_text_deltas_reach_dex_while_the_model_still_runs(provider: Provider) -> None:
    resume = asyncio.Event()
    reply = Reply("Hello, streaming world!", chunk_chars=6, pause_after=1, resume=resume)
    async with provider.server([reply]) as server, provider.model(server) as model:
        stream = model.stream(model_request())
        # a model that buffered the text would wait here for the paused server forever
        first = await asyncio.wait_for(anext(stream), 10)
        # the server is holding back the rest of the response until we resume it
        assert first == "Hello,"
        assert not resume.is_set()
        resume.set()
        rest = [event async for event in stream]
    *deltas, response = rest
    assert [first, *deltas] == ["Hello,", " strea", "ming w", "orld!"]
    assert isinstance(response, ModelResponse)
    assert response.text == "Hello, streaming world!"


async def test_a_429_is_a_rate_limit_with_its_retry_after_and_the_sdk_does_not_retry_it(
    provider: Provider,
) -> None:
    script: list[Entry] = [Fail(429, "slow down", headers={"retry-after": "7"}), Reply("fine now")]
    async with provider.server(script) as server, provider.model(server) as model:
        with pytest.raises(RateLimited) as caught:
            await collect(model, model_request())
        assert caught.value.retryable is True and caught.value.retry_after == 7
        assert "HTTP 429" in caught.value.message and "slow down" in caught.value.message
        assert len(server.requests) == 1  # max_retries=0: Dex's policy is the only one
        _, response = await collect(model, model_request(attempt=2))
    assert response.text == "fine now"


async def test_a_fake_rate_limit_refuses_a_set_part_and_calls_over_its_rate(
    provider: Provider,
) -> None:
    clock = [0.0]
    every_third = RateLimit(fraction=1 / 3, clock=lambda: clock[0])
    async with (
        provider.server(lambda body: Reply("ok"), rate_limit=every_third) as server,
        provider.model(server) as model,
    ):
        outcomes = []
        for _ in range(6):
            try:
                await collect(model, model_request())
                outcomes.append("ok")
            except RateLimited as e:
                outcomes.append(f"429 {e.retry_after:g}")
    assert outcomes == ["ok", "ok", "429 1", "ok", "ok", "429 1"]
    assert (every_third.served, every_third.refused) == (4, 2)

    per_minute = RateLimit(rpm=60, burst=2.0, clock=lambda: clock[0])  # one a second
    async with (
        provider.server(lambda body: Reply("ok"), rate_limit=per_minute) as server,
        provider.model(server) as model,
    ):
        waits = []
        for at in (10.0, 10.0, 10.0, 10.0, 10.5, 11.0, 11.0):
            clock[0] = at
            try:
                await collect(model, model_request())
                waits.append(0.0)
            except RateLimited as e:
                assert e.retry_after is not None
                waits.append(e.retry_after)
    # three at once (the burst of 2 s, and the one due now), then one a second; a refusal
    # asks for the wait rounded up to whole seconds, and takes nothing of the bucket
    assert waits == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert (per_minute.served, per_minute.refused) == (4, 3)
    assert len(server.requests) == 7


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (500, True),
        (503, True),
        (408, True),
        (409, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
async def test_http_errors_map_onto_the_retry_policy(
    provider: Provider, status: int, retryable: bool
) -> None:
    async with (
        provider.server([Fail(status, "scripted")]) as server,
        provider.model(server) as model,
    ):
        with pytest.raises(ModelError) as caught:
            await collect(model, model_request())
    assert caught.value.retryable is retryable
    assert f"HTTP {status}" in caught.value.message
    assert len(server.requests) == 1


async def test_an_error_inside_the_stream(provider: Provider) -> None:
    script = [
        Fail(529, "Overloaded", error_type="overloaded_error", in_stream=True),
        Fail(400, "bad prompt", error_type="invalid_request_error", in_stream=True),
    ]
    if provider.name == "openai-responses":
        script = [
            Fail(500, "oops", error_type="server_error", in_stream=True),
            Fail(400, "bad prompt", error_type="invalid_prompt", in_stream=True),
        ]
    async with provider.server(script) as server, provider.model(server) as model:
        with pytest.raises(ModelError) as retryable:
            await collect(model, model_request())
        with pytest.raises(ModelError) as fatal:
            await collect(model, model_request())
    assert retryable.value.retryable is True
    assert "error in the stream" in retryable.value.message
    assert fatal.value.retryable is False
    assert "bad prompt" in fatal.value.message


async def test_malformed_tool_call_arguments_reach_the_tool_as_raw_text(
    provider: Provider,
) -> None:
    reply = Reply(
        tool_calls=[
            ScriptedCall("get_weather", '{"city": "Par', id="call_bad"),
            ScriptedCall("get_weather", {"city": "Oslo"}, id="call_ok"),
        ]
    )
    async with provider.server([reply]) as server, provider.model(server) as model:
        _, response = await collect(model, model_request())
    bad, ok = response.tool_calls
    assert bad == ModelToolCall(
        id="call_bad", name="get_weather", arguments={tr.INVALID_ARGUMENTS_KEY: '{"city": "Par'}
    )
    assert ok.arguments == {"city": "Oslo"}


async def test_a_dropped_connection_mid_stream_is_retryable(provider: Provider) -> None:
    script = [Reply("This answer is cut short", drop_after=2), Reply("Whole answer.")]
    async with provider.server(script) as server, provider.model(server) as model:
        seen: list[str] = []
        with pytest.raises(ModelError) as caught:
            async for event in model.stream(model_request()):
                seen.append(event)  # type: ignore[arg-type]
        assert seen == ["This ", "answe"]
        assert caught.value.retryable is True
        assert "connection failed" in caught.value.message
        _, response = await collect(model, model_request(attempt=2))
    assert response.text == "Whole answer."


async def test_a_stream_that_ends_early_is_retryable(provider: Provider) -> None:
    async with (
        provider.server([Reply("Half an answer", truncate_after=1)]) as server,
        provider.model(server) as model,
    ):
        with pytest.raises(ModelError) as caught:
            await collect(model, model_request())
    assert caught.value.retryable is True
    assert "ended before the response was complete" in caught.value.message


async def test_a_stalled_stream_times_out_retryably(provider: Provider) -> None:
    async with (
        provider.server([Reply("Hello there", pause_after=1)]) as server,
        provider.model(server, timeout=0.3) as model,
    ):
        with pytest.raises(ModelError) as caught:
            await collect(model, model_request())
    assert caught.value.retryable is True
    assert "connection failed" in caught.value.message
    assert "Timeout" in caught.value.message


async def test_max_tokens_is_reported_as_the_stop_reason(provider: Provider) -> None:
    reply = Reply("The answer is cut", stop_reason="max_tokens")
    async with provider.server([reply]) as server, provider.model(server) as model:
        _, response = await collect(model, model_request())
    assert response.stop_reason == "max_tokens"
    assert response.text == "The answer is cut"


async def test_concurrent_streams_share_one_model(provider: Provider) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        question = sent_history(provider, body)[-1]
        assert isinstance(question, UserItem)
        return Reply(f"answer to {question.text}")

    async with provider.server(answer) as server, provider.model(server) as model:
        results = await asyncio.gather(
            *(collect(model, model_request([UserItem(text=f"q{i}")])) for i in range(5))
        )
    assert [r.text for _, r in results] == [f"answer to q{i}" for i in range(5)]


async def test_notes_and_summaries_reach_the_model_as_marked_text(provider: Provider) -> None:
    history: list[Item] = [
        UserItem(text="Book it."),
        AssistantItem(tool_calls=[ModelToolCall(id="c1", name="get_weather", arguments={})]),
        ToolResultItem(
            call_id="c1", name="get_weather", status=ToolCallStatus.DENIED, error="the user said no"
        ),
        NoteItem(text="The previous turn failed before the model could answer."),
        UserItem(text="Try again?"),
    ]
    async with provider.server([Reply("ok")]) as server, provider.model(server) as model:
        await collect(model, model_request(history))
    raw = json.dumps(server.requests[0].body)
    assert "[note] The previous turn failed before the model could answer." in raw
    assert "denied: the user said no" in raw
    assert sent_history(provider, server.requests[0].body) == history


# --- keys and spec ---------------------------------------------------------------------------


async def test_the_key_comes_from_the_environment_and_never_enters_spec(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = "ANTHROPIC_API_KEY" if provider.name == "anthropic" else "OPENAI_API_KEY"
    async with provider.server([Reply("hi")], api_key="sk-from-env") as server:
        monkeypatch.setenv(variable, "sk-from-env")
        async with provider.model(server, api_key=None) as model:
            _, response = await collect(model, model_request())
            spec = model.spec()
    assert response.text == "hi"
    assert "sk-from-env" not in json.dumps(spec) and "sk-from-env" not in repr(model)
    assert spec["provider"] == provider.name.split("-")[0]
    assert spec["model"] in ("claude-test", "gpt-test")
    assert spec["base_url"] == server.base_url


async def test_an_explicit_key_never_enters_spec(provider: Provider) -> None:
    async with (
        provider.server([Reply("hi")], api_key="sk-explicit-123") as server,
        provider.model(server, api_key="sk-explicit-123") as model,
    ):
        await collect(model, model_request())
        assert "sk-explicit-123" not in json.dumps(model.spec())


async def test_a_wrong_key_fails_fast(provider: Provider) -> None:
    async with (
        provider.server([Reply("hi")], api_key="right") as server,
        provider.model(server, api_key="wrong") as model,
    ):
        with pytest.raises(ModelError) as caught:
            await collect(model, model_request())
    assert caught.value.retryable is False and "HTTP 401" in caught.value.message


async def test_no_key_fails_fast_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for model in (Anthropic("claude-test"), OpenAI("gpt-test")):
        with pytest.raises(ModelError) as caught:
            await collect(model, model_request())
        assert caught.value.retryable is False
        assert "API_KEY" in caught.value.message


def test_spec_is_plain_data_with_the_settings() -> None:
    assert Anthropic("claude-x", max_tokens=100, temperature=0.2, api_key="k").spec() == {
        "provider": "anthropic",
        "model": "claude-x",
        "max_tokens": 100,
        "temperature": 0.2,
        "timeout": 600.0,
    }
    local = OpenAI(
        "llama3", api="chat", base_url="http://localhost:11434/v1", params={"max_tokens": 50}
    )
    assert local.spec() == {
        "provider": "openai",
        "model": "llama3",
        "api": "chat",
        "stream_usage": True,
        "base_url": "http://localhost:11434/v1",
        "timeout": 600.0,
        "params": {"max_tokens": 50},
    }
    assert OpenAI("gpt-x").spec()["api"] == "responses"
    with pytest.raises(ValueError):
        OpenAI("gpt-x", api="completions")  # type: ignore[arg-type]


# --- provider specifics ---------------------------------------------------------------------


async def test_an_openai_compatible_server_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM or Ollama: base_url and no key; usage may be switched off for old servers."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = Provider("openai-chat")
    async with (
        provider.server([Reply("local answer")], api_key=None) as server,
        OpenAI(
            "llama3",
            api="chat",
            base_url=server.base_url,
            stream_usage=False,
            params={"max_tokens": 64},
        ) as model,
    ):
        _, response = await collect(model, model_request())
    assert response.text == "local answer"
    body = server.requests[0].body
    assert "stream_options" not in body and body["max_tokens"] == 64
    assert response.usage == Usage()  # the server was not asked for it


async def test_params_and_settings_reach_the_request(provider: Provider) -> None:
    async with provider.server([Reply("x")]) as server:
        kwargs: dict[str, Any] = {"temperature": 0.1, "params": {"metadata": {"user_id": "u1"}}}
        if provider.name == "anthropic":
            kwargs["max_tokens"] = 77
        else:
            kwargs["max_output_tokens"] = 77
        async with provider.model(server, **kwargs) as model:
            await collect(model, model_request())
    body = server.requests[0].body
    assert body["temperature"] == 0.1 and body["metadata"] == {"user_id": "u1"}
    limit = {
        "anthropic": "max_tokens",
        "openai-chat": "max_completion_tokens",
        "openai-responses": "max_output_tokens",
    }[provider.name]
    assert body[limit] == 77


async def test_a_tools_constraints_and_descriptions_reach_the_provider(
    provider: Provider,
) -> None:
    @dex.tool(kind="read")
    async def top(
        city: str, n: Annotated[int, Field(ge=1, le=10, description="How many.")] = 3
    ) -> str:
        """The best places of a city.

        Args:
            city: The city, with its country.
        """
        return city

    script = [Reply(tool_calls=[ScriptedCall("top", {"city": "Oslo", "n": 2}, id="c1")])]
    async with provider.server(script) as server, provider.model(server) as model:
        _, response = await collect(model, model_request(tools=[top.spec()]))
    assert response.tool_calls == [
        ModelToolCall(id="c1", name="top", arguments={"city": "Oslo", "n": 2})
    ]
    (sent,) = server.requests[0].body["tools"]
    schema = sent.get("input_schema") or sent.get("parameters") or sent["function"]["parameters"]
    n = schema["properties"]["n"]
    assert (n["type"], n["minimum"], n["maximum"], n["description"]) == (
        "integer",
        1,
        10,
        "How many.",
    )
    assert schema["properties"]["city"]["description"] == "The city, with its country."
    description = sent.get("description") or sent["function"]["description"]
    assert description == "The best places of a city."


def test_a_model_serves_one_event_loop_after_another() -> None:
    """An SDK client belongs to one event loop: each loop gets its own, reused within it."""
    provider = Provider("anthropic")
    model = Anthropic("claude-test", api_key="k")
    clients: list[Any] = []

    async def once(text: str) -> str:
        async with provider.server([Reply(text)], api_key=None) as server:
            model.base_url = server.base_url
            clients.append(model.client())
            assert model.client() is clients[-1]
            _, response = await collect(model, model_request())
            await model.aclose()
            return response.text

    assert asyncio.run(once("one")) == "one"
    assert asyncio.run(once("two")) == "two"
    assert clients[0] is not clients[1]


def test_a_fake_server_in_a_thread_holds_a_stream_open_for_a_crash_test() -> None:
    """What a crash test needs: the model stream is open (server.paused) when the client
    goes away, and the next attempt gets the next reply."""
    provider = Provider("openai-chat")
    server = provider.server([Reply("Hello there", pause_after=1), Reply("Second attempt.")])
    with server.in_thread():
        model = provider.model(server)

        async def first_delta_then_vanish() -> str:
            stream = model.stream(model_request())
            delta = await anext(stream)
            assert isinstance(stream, AsyncGenerator)  # Model.stream promises only an AsyncIterator
            await stream.aclose()  # the "Worker" goes away with the stream open
            await model.aclose()
            return delta  # type: ignore[return-value]

        assert asyncio.run(first_delta_then_vanish()) == "Hello"
        assert server.paused == 1

        async def retry() -> str:
            async with model:
                _, response = await collect(model, model_request(attempt=2))
            return response.text

        assert asyncio.run(retry()) == "Second attempt."
    assert len(server.requests) == 2

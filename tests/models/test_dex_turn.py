"""A full Dex turn in process for each provider: a real Dex Server (uvicorn), a Worker
serving an agent whose model points at the fake provider server, and a Client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import dex
from dex.models import _translate as tr
from dex.models._sdk import SDKModel
from dex.testing.fake_providers import Entry, Fail, FakeProvider, Reply, ScriptedCall
from dex.testing.wait import wait_until_async
from dex.wire import AssistantItem, UserItem
from tests.models.conftest import Provider, agent_registered, sent_history

CALLS: list[str] = []


@dex.tool(kind="read")
async def get_weather(city: str) -> dict[str, Any]:
    """The forecast for a city."""
    CALLS.append(city)
    return {"city": city, "forecast": "sunny"}


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()


@asynccontextmanager
async def serving(
    address: str, model: SDKModel[Any], name: str = "weather"
) -> AsyncIterator[dex.Client]:
    """A Worker serving the agent ``name`` with ``model``, and a Client; both closed after."""
    agent = dex.Agent(
        name=name,
        model=model,
        instructions="Answer weather questions.",
        tools=[get_weather],
        model_retry=dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
    )
    try:
        worker = dex.Worker([agent], address, dex.WorkerConfig(drain_timeout=5.0))
        async with worker, dex.Client(address) as client:
            await wait_until_async(
                agent_registered(client, name, model.provider), what="the agent to register"
            )
            yield client
    finally:
        await model.aclose()


async def run_turn(
    address: str, provider: Provider, server: FakeProvider, text: str = "Weather in Paris?"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One turn: (the turn record, the session snapshot)."""
    async with serving(address, provider.model(server)) as client:
        session = await client.create_session("weather")
        turn = await client.send_message(session["id"], text, wait=True, timeout=60)
        snapshot = await client.get_agent_snapshot(session["id"])
    return turn, snapshot


def model_steps(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in turn["steps"] if s["type"] == "RunModel"]


async def test_a_turn_with_parallel_tool_calls(dex_address: str, provider: Provider) -> None:
    script = [
        Reply(
            "Checking.",
            tool_calls=[
                ScriptedCall("get_weather", {"city": "Paris"}, id="call_paris"),
                ScriptedCall("get_weather", {"city": "Oslo"}, id="call_oslo"),
            ],
            input_tokens=120,
            output_tokens=30,
        ),
        Reply("Sunny in Paris and in Oslo.", input_tokens=200, output_tokens=9),
    ]
    async with provider.server(script) as server:
        turn, snapshot = await run_turn(dex_address, provider, server)

    assert turn["status"] == "completed", turn
    assert turn["text"] == "Sunny in Paris and in Oslo."
    calls = turn["tool_calls"]
    assert [(c["model_call_id"], c["name"], c["arguments"], c["status"]) for c in calls] == [
        ("call_paris", "get_weather", {"city": "Paris"}, "succeeded"),
        ("call_oslo", "get_weather", {"city": "Oslo"}, "succeeded"),
    ]
    assert sorted(CALLS) == ["Oslo", "Paris"]
    steps = model_steps(turn)
    assert [s["usage"] for s in steps] == [
        {"input_tokens": 120, "output_tokens": 30},
        {"input_tokens": 200, "output_tokens": 9},
    ]
    assert [len(s["attempts"]) for s in steps] == [1, 1]
    # the model saw both results on the second request
    results = [
        i for i in sent_history(provider, server.requests[1].body) if i.type == "tool_result"
    ]
    assert [(r.call_id, r.status, r.result) for r in results] == [
        ("call_paris", "succeeded", {"city": "Paris", "forecast": "sunny"}),
        ("call_oslo", "succeeded", {"city": "Oslo", "forecast": "sunny"}),
    ]
    history = snapshot["history"]
    assert [i["type"] for i in history] == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",
    ]
    assert history[1]["text"] == "Checking."


async def test_a_429_goes_back_unattempted_and_runs_again_after_its_retry_after(
    dex_address: str, provider: Provider
) -> None:
    entries: list[Entry] = [
        Fail(429, "rate limited", headers={"retry-after": "0.5"}),
        Reply("Here you go.", input_tokens=5, output_tokens=3),
    ]
    asked: list[float] = []

    def script(body: dict[str, Any]) -> Entry:
        asked.append(time.monotonic())
        return entries[len(asked) - 1]

    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "completed" and turn["text"] == "Here you go."
    (step,) = model_steps(turn)
    assert [a["outcome"] for a in step["attempts"]] == ["succeeded"]  # the 429 used none
    assert step["rate_limited"] == 1 and step["attempts"][0]["number"] == 1
    assert step["usage"] == {"input_tokens": 5, "output_tokens": 3}
    assert len(server.requests) == 2
    assert asked[1] - asked[0] >= 0.5  # the provider's Retry-After was honoured


async def test_rate_limits_beyond_the_retry_policy_never_fail_the_turn(
    dex_address: str, provider: Provider
) -> None:
    # five refusals, more than the three attempts the policy allows a failing call
    script: list[Entry] = [Fail(429, "slow down", headers={"retry-after": "0.05"})] * 5
    script.append(Reply("Finally."))
    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "completed" and turn["text"] == "Finally."
    (step,) = model_steps(turn)
    assert [a["outcome"] for a in step["attempts"]] == ["succeeded"]
    assert step["rate_limited"] == 5
    assert len(server.requests) == 6


async def test_a_step_held_by_a_rate_limit_says_so_in_the_snapshot(
    dex_address: str, provider: Provider
) -> None:
    script: list[Entry] = [Fail(429, "slow down", headers={"retry-after": "30"}), Reply("ok")]
    async with (
        provider.server(script) as server,
        serving(dex_address, provider.model(server)) as client,
    ):
        session = await client.create_session("weather")
        sid = session["id"]
        await client.send_message(sid, "Weather?")

        async def held() -> bool:
            snapshot = await client.get_agent_snapshot(sid)
            return [w["waiting_for"] for w in snapshot["waiting"]] == [
                "the model provider's rate limit"
            ]

        await wait_until_async(held, what="the Step waits for the rate limit")
        snapshot = await client.get_agent_snapshot(sid)
        (waiting,) = snapshot["waiting"]
        assert waiting["not_before"] >= time.time() + 20  # the provider's 30 s
        (step,) = snapshot["current_turn"]["steps"]
        assert step["status"] == "queued" and step["attempts"] == []
        assert len(server.requests) == 1
        await client.cancel_turn(sid)


async def test_a_500_until_the_attempts_run_out_fails_the_turn(
    dex_address: str, provider: Provider
) -> None:
    script: list[Entry] = [Fail(500, "internal error")] * 3 + [Reply("never sent")]
    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "failed"
    assert "HTTP 500" in turn["error"]
    (step,) = model_steps(turn)
    assert [a["outcome"] for a in step["attempts"]] == ["failed"] * 3
    assert len(server.requests) == 3  # three Dex attempts, no SDK retries


async def test_a_400_fails_the_turn_at_once(dex_address: str, provider: Provider) -> None:
    script: list[Entry] = [Fail(400, "messages: bad"), Reply("never sent")]
    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "failed" and "HTTP 400" in turn["error"]
    (step,) = model_steps(turn)
    assert len(step["attempts"]) == 1
    assert step["attempts"][0]["error"]["retryable"] is False
    assert len(server.requests) == 1


async def test_a_malformed_tool_call_fails_the_call_and_the_model_sees_why(
    dex_address: str, provider: Provider
) -> None:
    script = [
        Reply(tool_calls=[ScriptedCall("get_weather", '{"city": "Par', id="call_bad")]),
        Reply(tool_calls=[ScriptedCall("get_weather", {"city": "Paris"}, id="call_good")]),
        Reply("Sunny in Paris."),
    ]
    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "completed" and turn["text"] == "Sunny in Paris."
    bad, good = turn["tool_calls"]
    assert bad["status"] == "failed"
    assert bad["arguments"] == {tr.INVALID_ARGUMENTS_KEY: '{"city": "Par'}
    assert tr.INVALID_ARGUMENTS_KEY in bad["error"]
    assert good["status"] == "succeeded"
    assert CALLS == ["Paris"]  # the malformed call never ran
    seen = json.dumps(server.requests[1].body)
    assert "failed: invalid arguments for tool 'get_weather'" in seen


async def test_a_dropped_connection_mid_stream_retries_the_step(
    dex_address: str, provider: Provider
) -> None:
    script = [Reply("Partial answ", drop_after=1), Reply("Complete answer.")]
    async with provider.server(script) as server:
        turn, _ = await run_turn(dex_address, provider, server)
    assert turn["status"] == "completed" and turn["text"] == "Complete answer."
    (step,) = model_steps(turn)
    assert [a["outcome"] for a in step["attempts"]] == ["failed", "succeeded"]
    assert "connection failed" in step["attempts"][0]["error"]["message"]


async def test_a_session_switches_provider_between_turns(dex_address: str) -> None:
    """Turn 1 runs on Anthropic, turn 2 on OpenAI: the second model reads the first's turn."""
    anthropic, openai = Provider("anthropic"), Provider("openai-responses")
    first_script = [
        Reply(tool_calls=[ScriptedCall("get_weather", {"city": "Lima"}, id="toolu_lima")]),
        Reply("Lima is sunny."),
    ]
    async with anthropic.server(first_script) as first, openai.server([Reply("Yes.")]) as second:
        async with serving(dex_address, anthropic.model(first)) as client:
            session = await client.create_session("weather")
            one = await client.send_message(session["id"], "Lima?", wait=True, timeout=60)
        async with serving(dex_address, openai.model(second)) as client:
            two = await client.send_message(session["id"], "Sure?", wait=True, timeout=60)
    assert one["status"] == "completed" and two["status"] == "completed"
    assert two["text"] == "Yes."
    first_history = tr.from_anthropic(first.requests[1].body["messages"])
    assert tr.from_responses(second.requests[0].body["input"]) == [
        *first_history,
        AssistantItem(text="Lima is sunny."),
        UserItem(text="Sure?"),
    ]
    assert [i.type for i in first_history] == ["user", "assistant", "tool_result"]


async def test_deltas_reach_the_dex_server_while_the_model_runs(
    dex_address: str, provider: Provider
) -> None:
    resume = asyncio.Event()
    script = [Reply("Sunny all week.", chunk_chars=6, pause_after=1, resume=resume)]
    async with (
        provider.server(script) as server,
        serving(dex_address, provider.model(server)) as client,
    ):
        session = await client.create_session("weather")
        sent = await client.send_message(session["id"], "Weather?")

        async def streamed() -> list[dict[str, Any]]:
            running = (await client.get_agent_snapshot(session["id"]))["running"]
            return [r for r in running if r["output_chars"] > 0]

        (running,) = await wait_until_async(streamed, what="the first delta on the server")
        # the model is still held mid-response by the fake provider
        assert server.paused == 1 and not resume.is_set()
        assert running["output_chars"] == len("Sunny ")
        resume.set()
        turn = await client.wait_turn(session["id"], sent["turn"], timeout=60)
    assert turn["status"] == "completed" and turn["text"] == "Sunny all week."

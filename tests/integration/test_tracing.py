"""OpenTelemetry traces as a user sees them in a trace viewer: a real server and a real
Worker in this process, both exporting to one in-memory exporter.

    dex.turn
      RunModel -> attempt -> dex.model tracer
      CallTool lookup -> attempt (failed) -> dex.tool lookup (error)
                      -> attempt         -> dex.tool lookup -> the tool's own span
      RunModel -> attempt -> dex.model tracer
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import dex
from dex.models import Scripted, call, say
from dex.testing import free_port, wait_until_async
from dex.wire import Item, ModelResponse, RetryPolicy, ToolResultItem, UserItem
from tests.integration.conftest import FAST_WORKER, run_server

LOOKUPS: list[int] = []
USER_TRACER: list[trace.Tracer] = []
"""What the tool's own code traces with (a real program: ``trace.get_tracer(...)``)."""
ENTERED = asyncio.Event()
OPEN = asyncio.Event()


def script(history: list[Item]) -> ModelResponse:
    if isinstance(history[-1], ToolResultItem):
        return say(f"found {history[-1].result}")
    user = history[-1]
    assert isinstance(user, UserItem)
    name = "lookup" if user.text == "look it up" else "wait_for_it"
    return ModelResponse(tool_calls=[call(name, "c1", key="b")])


@dex.tool(kind="read", retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0))
async def lookup(key: str, ctx: dex.ToolContext) -> str:
    """Fails on its first attempt."""
    LOOKUPS.append(ctx.attempt)
    if ctx.attempt == 1:
        raise KeyError(key)
    with USER_TRACER[0].start_as_current_span("query the table"):
        return f"value of {key}"


@dex.tool(kind="read", retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0))
async def wait_for_it(key: str, ctx: dex.ToolContext) -> str:
    """Waits for the test on its first attempt."""
    if ctx.attempt == 1:
        ENTERED.set()
        await OPEN.wait()
    return key


AGENT = dex.Agent(
    name="tracer",
    model=Scripted(script),
    tools=[lookup, wait_for_it],
    model_retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0),
)
TRACING_WORKER = FAST_WORKER.model_copy(update={"tracing": True})


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    USER_TRACER[:] = [provider.get_tracer("user code")]
    yield provider, exporter
    provider.shutdown()


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def dex_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """Dex's spans and the tool's, not FastAPI's spans of HTTP requests."""
    return [
        s for s in spans if s.instrumentation_scope and s.instrumentation_scope.name != "fastapi"
    ]


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [
        s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


async def ended(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    async def exported() -> bool:
        return any(s.name == name for s in exporter.get_finished_spans())

    await wait_until_async(exported, what=f"span {name} exported")
    return list(exporter.get_finished_spans())


async def test_a_turn_is_one_trace_with_steps_attempts_and_the_workers_spans(
    tmp_path: Path, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    LOOKUPS.clear()
    async with (
        run_server(tmp_path / "data", tracing=True, tracer_provider=provider) as address,
        dex.Client(address, timeout=15) as client,
        dex.Worker([AGENT], address, TRACING_WORKER, tracer_provider=provider),
    ):
        await wait_until_async(
            lambda: _serves(client, AGENT.name), what="the Worker registered its agent"
        )
        session = (await client.create_session(AGENT.name))["id"]
        turn = await client.send_message(session, "look it up", wait=True)
        assert turn["status"] == "completed" and turn["text"] == "found value of b"
        finished = await ended(exporter, "dex.turn")

    (root,) = by_name(finished, "dex.turn")
    assert root.parent is None
    assert root.attributes is not None and root.attributes["dex.session_id"] == session
    assert root.attributes["dex.turn.status"] == "completed"
    assert {s.context.trace_id for s in dex_spans(finished) if s.context} == {root.context.trace_id}
    (request,) = [s for s in finished if s.context == root.links[0].context]
    assert request.name == "POST /v1/sessions/{session_id}/messages"  # FastAPI's span
    steps = children(finished, root)
    assert [s.name for s in steps] == ["RunModel", "CallTool lookup", "RunModel"]

    model_attempt, *_ = children(finished, steps[0])
    assert [s.name for s in children(finished, model_attempt)] == ["dex.model tracer"]

    failed, retried = children(finished, steps[1])
    assert [a.attributes and a.attributes["dex.attempt"] for a in (failed, retried)] == [1, 2]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "KeyError: 'b'"  # what the snapshot records
    (tool_failed,) = children(finished, failed)
    assert tool_failed.name == "dex.tool lookup"
    assert tool_failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in tool_failed.events] == ["exception"]  # with its traceback
    (tool_ok,) = children(finished, retried)
    assert tool_ok.status.status_code == StatusCode.UNSET
    assert [s.name for s in children(finished, tool_ok)] == ["query the table"]
    assert LOOKUPS == [1, 2]


async def test_a_turn_that_crosses_a_server_restart_stays_one_trace(
    tmp_path: Path, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    ENTERED.clear()
    OPEN.clear()
    port = free_port()
    data = tmp_path / "data"
    async with (
        dex.Client(f"http://127.0.0.1:{port}", timeout=30) as client,
        dex.Worker([AGENT], f"http://127.0.0.1:{port}", TRACING_WORKER, tracer_provider=provider),
    ):
        async with run_server(data, port=port, tracing=True, tracer_provider=provider):
            await wait_until_async(lambda: _serves(client, AGENT.name), what="agent registered")
            session = (await client.create_session(AGENT.name))["id"]
            number = (await client.send_message(session, "wait"))["turn"]
            await asyncio.wait_for(ENTERED.wait(), 10)
        # the node stopped with the tool running; a new node on the same data recovers it,
        # failing the attempt at once (no reclaim window: the Worker that runs on would
        # reclaim it, and the retry's spans are what this test follows)
        async with run_server(
            data, port=port, tracing=True, tracer_provider=provider, reclaim_window=0
        ):
            turn = await client.wait_turn(session, number, timeout=20)
            assert turn["status"] == "completed"
            finished = await ended(exporter, "dex.turn")
        OPEN.set()

    (resumed,) = by_name(finished, "dex.turn")  # the first node's turn span died with it
    assert resumed.attributes is not None and resumed.attributes["dex.turn.resumed"] is True
    assert {s.context.trace_id for s in dex_spans(finished) if s.context} == {
        resumed.context.trace_id
    }
    original = resumed.parent
    assert original is not None
    assert [link.context.span_id for link in resumed.links] == [original.span_id]
    first_model = by_name(finished, "RunModel")[0]
    assert first_model.parent is not None  # it ended on the first node, under its turn span
    assert first_model.parent.span_id == original.span_id
    (step,) = [s for s in children(finished, resumed) if s.name == "CallTool wait_for_it"]
    failed, retried = children(finished, step)
    assert failed.attributes is not None
    assert failed.attributes["dex.attempt_progress"] == "NOT_COMPLETED"
    assert failed.status.status_code == StatusCode.ERROR
    assert [s.name for s in children(finished, retried)] == ["dex.tool wait_for_it"]
    assert [s.name for s in children(finished, resumed)][-1] == "RunModel"


async def _serves(client: dex.Client, agent: str) -> bool:
    return any(a["name"] == agent and a["workers"] for a in await client.list_agents())

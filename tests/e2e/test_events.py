"""Streaming a session's events to a client (Server-Sent Events), with resume."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import dex
from tests.support.rig import Rig


async def collect(
    client: dex.Client, sid: str, until: str, after: int | None = None
) -> list[dict[str, Any]]:
    events = []
    async for event in client.stream_events(sid, last_event_id=after):
        events.append(event)
        if event["type"] == until:
            return events
    raise AssertionError("the stream ended early")


def test_a_client_streams_model_output_and_lifecycle_and_resumes(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("streamer")  # streams 4 characters every 10 ms
    text = "stream me please " * 5

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with dex.Client(rig.server.address) as client:
            # a subscriber gets the buffered events first, so the order does not matter
            await client.send_message(sid, text)
            live = await asyncio.wait_for(collect(client, sid, "turn.completed"), 30)
            resumed = await asyncio.wait_for(
                collect(client, sid, "turn.completed", after=live[1]["id"]), 30
            )
            return live, resumed

    live, resumed = asyncio.run(scenario())
    types = [e["type"] for e in live]
    assert "turn.started" in types and types[-1] == "turn.completed"
    deltas = "".join(e["data"]["text"] for e in live if e["type"] == "model.delta")
    assert deltas == f"echo: {text}"  # the live output, as the model streamed it
    items = [e["data"]["item"]["type"] for e in live if e["type"] == "history.item"]
    assert items == ["user", "assistant"]
    assert [e["id"] for e in live] == sorted(e["id"] for e in live)
    assert [e["id"] for e in resumed] == [e["id"] for e in live[2:]]  # resume after id


def test_streaming_an_unknown_session_is_a_404(rig: Rig) -> None:
    rig.start_server()

    async def scenario() -> None:
        async with dex.Client(rig.server.address) as client:
            with pytest.raises(dex.NotFound):
                await collect(client, "nope", "turn.completed")

    asyncio.run(scenario())

"""Live streams on Redis survive the node: a subscriber that was reading a model's text
when the serving node was SIGKILLed reconnects with its last id to the restarted node, or
to the node that took its partition over, and reads on. It misses no history item and
sees none twice. A Worker that lives through the kill reclaims its attempt, whose text
streams on; when the Worker dies too, ``model.discard`` tells the subscriber to drop the
killed attempt's text before the retry streams. Real processes: server node(s), a
Worker, Redis, and PostgreSQL for the takeover."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import dex
from dex.server.streams.memory import parse_id
from tests.support.rig import SERVER_RESTART_POSTGRES, TAKEOVER, Rig

TEXT = "a long answer that streams for a while " * 12


async def read_through_a_kill(rig: Rig, sid: str, kill: Callable[[], None]) -> list[dict[str, Any]]:
    """Every event of the turn, read by one subscriber that resumes by its last id while
    ``kill`` kills the serving node and service comes back."""
    events: list[dict[str, Any]] = []
    killed: asyncio.Task[None] | None = None
    last: str | None = None
    async with dex.Client(rig.address, timeout=60) as client:
        await client.send_message(sid, TEXT)
        while True:
            try:
                async for event in client.stream_events(sid, last_event_id=last):
                    events.append(event)
                    last = event["id"]
                    deltas = sum(e["type"] == "model.delta" for e in events)
                    if killed is None and deltas == 10:  # mid-answer: SIGKILL the node
                        killed = asyncio.create_task(asyncio.to_thread(kill))
                    if event["type"] == "turn.completed":
                        assert killed is not None
                        await killed
                        return events
            except dex.Unavailable:
                await asyncio.sleep(0.05)  # the node is down: ask again (deadline: timeout)


@pytest.mark.parametrize(
    ("column", "worker_dies"),
    [
        ("Server restart", False),
        (SERVER_RESTART_POSTGRES, False),
        (TAKEOVER, False),
        (TAKEOVER, True),
    ],
    ids=["sqlite", "postgres", "takeover", "takeover-worker-dies"],
)
def test_a_subscriber_reads_on_through_a_node_kill_without_gap_or_duplicate(
    rig: Rig, column: str, worker_dies: bool, redis_url: str
) -> None:
    for node in rig.nodes:
        node.env["DEX_STREAMS"] = redis_url
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("streamer")  # streams 4 characters every 10 ms

    def kill() -> None:
        if worker_dies:
            worker.kill()
        rig.restart_server()
        if worker_dies:
            rig.start_worker()

    events = asyncio.run(asyncio.wait_for(read_through_a_kill(rig, sid, kill), 120))

    assert not [e for e in events if e["type"].startswith("stream.")]  # no gap, no drop
    ids = [parse_id(e["id"]) or (0, 0) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # in order, none twice
    items = [e["data"] for e in events if e["type"] == "history.item"]
    assert [i["index"] for i in items] == [0, 1]  # the user's message, the answer: once
    assert items[1]["item"]["text"] == f"echo: {TEXT}"

    discards = [i for i, e in enumerate(events) if e["type"] == "model.discard"]
    if not worker_dies:
        # the Worker lived through the kill and reclaimed the attempt: its text streams
        # on, one attempt, none of it void (what it streamed while no node listened is in
        # the answer, not in the stream)
        assert not discards
        deltas = [e["data"] for e in events if e["type"] == "model.delta"]
        assert len({d["attempt_id"] for d in deltas}) == 1
        assert f"echo: {TEXT}".startswith(deltas[0]["text"])
        assert len("".join(d["text"] for d in deltas)) <= len(f"echo: {TEXT}")
        return
    # the killed attempt's text is void: after its discard, the retry streams it whole
    assert discards, "the killed attempt was not discarded"
    killed = events[discards[-1]]["data"]["attempt_id"]
    before = [e for e in events[: discards[-1]] if e["type"] == "model.delta"]
    assert before and {e["data"]["attempt_id"] for e in before} == {killed}
    after = [e["data"] for e in events[discards[-1] :] if e["type"] == "model.delta"]
    assert {d["attempt_id"] for d in after} != {killed}
    assert "".join(d["text"] for d in after) == f"echo: {TEXT}"

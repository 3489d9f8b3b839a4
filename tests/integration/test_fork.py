"""Forking a session at a turn, through ``dex.Client``, a real server and a real Worker: the
fork has the history before that turn and goes its own way; the original never changes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import dex
from tests.integration.conftest import HELPER, HOLD


async def three_turns(client: dex.Client) -> str:
    session: str = (await client.create_session(HELPER.name))["id"]
    for text in ("add 1 2", "echo two", "add 3 4"):
        turn = await client.send_message(session, text, wait=True)
        assert turn["status"] == "completed"
    return session


def texts(snapshot: dict[str, Any]) -> list[str]:
    """The history as a person reads it: who said what."""
    return [
        f"{item['type']}: {item.get('text') or item.get('result') or item.get('tool_calls')}"
        for item in snapshot["history"]
    ]


async def test_a_fork_has_the_history_before_the_turn_and_goes_its_own_way(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    original = await three_turns(client)
    before = await client.get_agent_snapshot(original)

    forked = await client.fork_session(original, 2, "retry-two")
    assert forked["id"] == "retry-two" and forked["status"] == "idle"
    assert forked["forked_from"] == {"session_id": original, "turn": 2}
    listed = (await client.list_sessions())["sessions"]
    assert {k: forked[k] for k in listed[0]} == next(s for s in listed if s["id"] == "retry-two")
    fork = await client.get_agent_snapshot("retry-two")
    turn_two_starts = texts(before).index("user: echo two")
    assert texts(fork) == texts(before)[:turn_two_starts]  # all of turn 1, none of turn 2
    assert [(c["turn"], c["name"], c["result"]) for c in fork["tool_calls"]] == [(1, "add", 3)]
    first = await client.wait_turn("retry-two", 1)
    assert first["status"] == "completed" and first["text"] == (
        'results: [["add", "succeeded", 3, null]]'
    )

    again = await client.send_message("retry-two", "echo two, differently", wait=True)
    assert again["turn"] == 2 and again["text"] == "echo: echo two, differently"
    moved_on = await client.send_message(original, "echo four", wait=True)
    assert moved_on["turn"] == 4

    after = await client.get_agent_snapshot(original)
    assert after["history"][: len(before["history"])] == before["history"]
    assert texts(after)[len(before["history"]) :] == [
        "user: echo four",
        "assistant: echo: echo four",
    ]
    assert after["tool_calls"] == before["tool_calls"]
    assert texts(await client.get_agent_snapshot("retry-two"))[-1] == (
        "assistant: echo: echo two, differently"
    )


async def test_a_fork_one_past_the_last_turn_copies_the_whole_history(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    original = await three_turns(client)
    forked = await client.fork_session(original, 4)
    assert forked["id"] != original and forked["messages_received"] == 3
    copy = await client.get_agent_snapshot(forked["id"])
    assert copy["history"] == (await client.get_agent_snapshot(original))["history"]
    turn = await client.send_message(forked["id"], "add 5 6", wait=True)
    assert turn["turn"] == 4 and turn["tool_calls"][0]["id"] == "4.1"


@pytest.mark.parametrize(
    ("session", "body", "status", "says"),
    [
        ("nobody", {"turn": 1}, 404, "unknown session 'nobody'"),
        (None, {"turn": 9}, 404, "has no turn 9: fork at a turn from 1 to 3, or at 4"),
        (None, {"turn": 0}, 422, "the request is not valid"),
        (None, {"turn": 1, "session_id": "no spaces"}, 422, "a session id is 1-128"),
        (None, {"turn": 1, "extra": True}, 422, "the request is not valid"),
    ],
)
async def test_a_fork_that_cannot_be_made_is_a_clear_4xx_and_changes_nothing(
    client: dex.Client,
    dex_worker: dex.Worker,
    session: str | None,
    body: dict[str, Any],
    status: int,
    says: str,
) -> None:
    original = await three_turns(client)
    sessions = await client.list_sessions()
    with pytest.raises(dex.DexError) as refused:
        await client._request("POST", f"/v1/sessions/{session or original}/fork", body)
    assert refused.value.status == status and says in refused.value.message
    assert await client.list_sessions() == sessions


async def test_a_session_in_a_turn_or_a_taken_id_cannot_be_forked(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    original = await three_turns(client)
    await client.create_session(HELPER.name, "taken")
    with pytest.raises(dex.Conflict, match="'taken' already exists"):
        await client.fork_session(original, 1, "taken")
    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    number = (await client.send_message(original, "hold"))["turn"]
    await asyncio.wait_for(HOLD["entered"].wait(), 10)
    with pytest.raises(dex.Conflict, match="is in a turn: fork it once the turn has ended"):
        await client.fork_session(original, 1)
    HOLD["open"].set()
    assert (await client.wait_turn(original, number, timeout=10))["status"] == "completed"
    assert (await client.fork_session(original, 1))["messages_received"] == 0

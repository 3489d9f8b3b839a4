"""bench.creator against a real server: what it counts as created the server lists, and
an answer that is not a creation counts as a failure."""

from __future__ import annotations

from bench import creator

import dex
from tests.integration.conftest import HELPER


async def test_creator_creates_sessions_the_server_lists(
    server_address: str, client: dex.Client, dex_worker: dex.Worker
) -> None:
    tally = await creator.create(server_address, HELPER.name, clients=4, seconds=30, limit=40)
    assert (tally.created, tally.failed) == (40, 0)
    listed = (await client.list_sessions(limit=100))["sessions"]
    assert len(listed) == 40 and all(s["agent"] == HELPER.name for s in listed)


async def test_an_error_answer_counts_as_a_failure(
    server_address: str, client: dex.Client, dex_worker: dex.Worker
) -> None:
    tally = await creator.create(server_address, "no-such-agent", clients=2, seconds=30, limit=6)
    assert (tally.created, tally.failed) == (0, 6)
    assert (await client.list_sessions())["sessions"] == []


def test_only_a_json_object_with_a_string_id_is_a_creation() -> None:
    assert creator._has_id(b'{"id": "s1", "agent": "a"}')
    assert not creator._has_id(b'{"id": 7}')
    assert not creator._has_id(b'["s1"]')
    assert not creator._has_id(b"<html>")

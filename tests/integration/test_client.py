"""dex.Client and dex.SyncClient end to end: a real uvicorn server and a real dex.Worker,
both in this process."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import dex
from dex.cli.main import app as cli
from dex.testing import free_port, wait_until_async
from tests.integration.conftest import FAST_WORKER, HELPER, HOLD, charges, metric, run_server


def _results(turn: dict[str, Any]) -> list[list[Any]]:
    text = turn["text"]
    assert text.startswith("results: "), turn
    results: list[list[Any]] = json.loads(text.removeprefix("results: "))
    return results


async def test_create_and_list_sessions(client: dex.Client, dex_worker: dex.Worker) -> None:
    named = await client.create_session("helper", "alpha")
    assert named["id"] == "alpha" and named["agent"] == "helper" and named["status"] == "idle"
    generated = await client.create_session("helper")
    assert generated["id"] not in ("", "alpha")
    await client.create_session("helper", "beta")
    listed = (await client.list_sessions())["sessions"]
    assert [s["id"] for s in listed] == ["beta", generated["id"], "alpha"]  # newest first
    first_two = await client.list_sessions(limit=2)
    rest = await client.list_sessions(limit=2, cursor=first_two["next_cursor"])
    assert [s["id"] for s in first_two["sessions"] + rest["sessions"]] == [s["id"] for s in listed]
    assert rest["next_cursor"] is None
    between = (listed[1]["created_at"] + listed[2]["created_at"]) / 2
    since = datetime.fromtimestamp(between, UTC)
    newer = await client.list_sessions(created_since=since, status="idle", agent="helper")
    assert [s["id"] for s in newer["sessions"]] == ["beta", generated["id"]]
    with pytest.raises(ValueError, match="timezone"):
        await client.list_sessions(created_since=datetime(2024, 1, 1))


async def test_send_message_and_wait_returns_the_final_text(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    session = await client.create_session("helper")
    turn = await client.send_message(session["id"], "hello there", wait=True)
    assert turn["status"] == "completed"
    assert turn["text"] == "echo: hello there"
    assert turn["turn"] == 1 and turn["created"] is True
    second = await client.send_message(session["id"], "again", wait=True)
    assert second["turn"] == 2 and second["text"] == "echo: again"


async def test_tool_calls_succeed(client: dex.Client, dex_worker: dex.Worker) -> None:
    session = await client.create_session("helper")
    added = await client.send_message(session["id"], "add 2 40", wait=True)
    assert added["status"] == "completed"
    assert _results(added) == [["add", "succeeded", 42, None]]
    (call,) = added["tool_calls"]
    assert call["name"] == "add" and call["status"] == "succeeded" and call["result"] == 42

    charged = await client.send_message(session["id"], "charge 7", wait=True)
    assert _results(charged) == [["charge", "succeeded", "charged 7", None]]
    (call,) = charged["tool_calls"]
    assert charges == [(7, call["idempotency_key"], 1)]  # ran once, with the call's key

    refused = await client.send_message(session["id"], "refuse not today", wait=True)
    assert refused["status"] == "completed"
    assert _results(refused) == [["refuse", "failed", None, "not today"]]


async def test_a_result_json_cannot_carry_fails_the_attempt_and_the_worker_goes_on(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    """A result with an integer beyond 64 bits (here the model's tool call arguments) once
    killed the Worker: its writer failed and took the whole Worker down. Now the attempt
    fails like any exception, retries, and the Worker goes on serving."""
    session = await client.create_session("helper")
    huge = await asyncio.wait_for(
        client.send_message(session["id"], f"add {2**69} {2**69}", wait=True), 30
    )
    assert huge["status"] == "failed"
    assert huge["error"] == (
        "RunModel failed: the result cannot be sent as JSON: Integer exceeds 64-bit range"
    )
    assert len(huge["steps"][0]["attempts"]) == 3  # retried like any other exception
    fine = await client.send_message(session["id"], "add 2 40", wait=True)
    assert _results(fine) == [["add", "succeeded", 42, None]]


async def test_send_without_waiting_then_wait_turn(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    session = await client.create_session("helper")
    sent = await client.send_message(session["id"], "add 1 1", message_id="m-1")
    assert sent["turn"] == 1 and sent["created"] is True
    assert sent["status"] == "running"
    turn = await client.wait_turn(session["id"], sent["turn"])
    assert turn["status"] == "completed"
    assert _results(turn) == [["add", "succeeded", 2, None]]
    repeat = await client.send_message(session["id"], "add 1 1", message_id="m-1", wait=True)
    assert repeat["created"] is False and repeat["turn"] == 1
    assert repeat["text"] == turn["text"]


async def test_agent_snapshot(client: dex.Client, dex_worker: dex.Worker) -> None:
    session = await client.create_session("helper", "snap")
    await client.send_message("snap", "hi", wait=True)
    charged = await client.send_message("snap", "charge 3", wait=True)
    snapshot = await client.get_agent_snapshot(session["id"])
    assert snapshot["session"]["id"] == "snap"
    assert snapshot["session"]["status"] == "idle"
    assert snapshot["session"]["messages_received"] == 2
    assert snapshot["current_turn"] is None
    assert [item["type"] for item in snapshot["history"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool_result",
        "assistant",
    ]
    assert snapshot["history"][1]["text"] == "echo: hi"
    assert snapshot["history"][3]["tool_calls"][0]["name"] == "charge"
    assert snapshot["history"][4]["status"] == "succeeded"
    assert snapshot["history"][5]["text"] == charged["text"]
    (call,) = snapshot["tool_calls"]
    assert call["name"] == "charge"
    assert call["status"] == "succeeded"
    assert call["error"] is None
    assert call["turn"] == 2
    assert call["idempotency_key"] == charged["tool_calls"][0]["idempotency_key"]
    assert charges == [(3, call["idempotency_key"], 1)]


async def test_errors_map_to_dex_exceptions(client: dex.Client, dex_worker: dex.Worker) -> None:
    await client.create_session("helper", "taken")
    with pytest.raises(dex.NotFound) as missing:
        await client.get_agent_snapshot("nope")
    assert missing.value.status == 404 and missing.value.code == "not_found"
    with pytest.raises(dex.NotFound):
        await client.create_session("nobody")
    with pytest.raises(dex.NotFound):
        await client.send_message("nope", "hello")
    with pytest.raises(dex.NotFound):
        await client.wait_turn("taken", 5, timeout=1)
    with pytest.raises(dex.Conflict) as conflict:
        await client.create_session("helper", "taken")
    assert conflict.value.status == 409
    with pytest.raises(dex.InvalidInput) as invalid:
        await client.create_session("helper", "no spaces allowed")
    assert invalid.value.status == 422
    with pytest.raises(dex.InvalidInput):
        await client.list_sessions(limit=0)
    for exc in (missing.value, conflict.value, invalid.value):
        assert isinstance(exc, dex.DexError) and exc.message and not exc.retryable
    assert [s["id"] for s in (await client.list_sessions())["sessions"]] == ["taken"]


async def test_client_with_no_server_raises_unavailable() -> None:
    async with dex.Client(f"http://127.0.0.1:{free_port()}", timeout=5) as client:
        with pytest.raises(dex.Unavailable) as unavailable:
            await client.list_sessions()
    assert unavailable.value.retryable


async def test_client_and_worker_move_on_from_a_dead_address(server_address: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with (
        dex.Worker([HELPER], [dead, server_address], FAST_WORKER),
        dex.Client([dead, server_address], timeout=15) as client,
    ):

        async def registered() -> bool:
            return any(a["name"] == "helper" for a in await client.list_agents())

        await wait_until_async(registered, what="the Worker found the live server")
        session = await client.create_session("helper")
        turn = await client.send_message(session["id"], "hello", wait=True)
    assert turn["text"] == "echo: hello"


async def test_sync_client_from_plain_sync_code(
    server_address: str, dex_worker: dex.Worker
) -> None:
    def use() -> tuple[str, dict[str, Any], dict[str, Any]]:
        with dex.SyncClient(server_address, timeout=15) as sync:
            session = sync.create_session("helper")
            turn = sync.send_message(session["id"], "add 3 4", wait=True)
            snapshot = sync.get_agent_snapshot(session["id"])
            with pytest.raises(dex.NotFound):
                sync.get_agent_snapshot("nope")
            with pytest.raises(dex.Conflict):
                sync.create_session("helper", session["id"])
            return session["id"], turn, snapshot

    session_id, turn, snapshot = await asyncio.to_thread(use)
    assert turn["status"] == "completed"
    assert _results(turn) == [["add", "succeeded", 7, None]]
    assert snapshot["session"]["id"] == session_id and snapshot["session"]["status"] == "idle"
    assert len(snapshot["history"]) == 4


async def test_worker_shutdown_twice_and_concurrently(
    server_address: str, client: dex.Client, dex_worker: dex.Worker
) -> None:
    config = dex.WorkerConfig(
        heartbeat_interval=0.2, drain_timeout=5, reconnect_initial=0.02, worker_id="second"
    )
    second = dex.Worker([HELPER], server_address, config)
    running = asyncio.create_task(second.run())

    async def workers_connected(n: int) -> bool:
        return await metric(server_address, "dex_workers_connected") == n

    await wait_until_async(lambda: workers_connected(2), what="both Workers connected")
    await asyncio.wait_for(second.shutdown(), 10)
    assert running.done() and running.exception() is None
    await asyncio.wait_for(second.shutdown(), 1)  # again: returns at once
    await asyncio.wait_for(asyncio.gather(second.shutdown(), second.shutdown()), 1)
    await wait_until_async(lambda: workers_connected(1), what="the second Worker left")
    # the first Worker still serves
    session = await client.create_session("helper")
    assert (await client.send_message(session["id"], "still?", wait=True))["text"] == "echo: still?"


async def test_concurrent_shutdowns_of_a_running_worker(server_address: str) -> None:
    worker = dex.Worker([HELPER], server_address, FAST_WORKER)
    running = asyncio.create_task(worker.run())

    async def connected() -> bool:
        return await metric(server_address, "dex_workers_connected") == 1

    await wait_until_async(connected, what="the Worker connected")
    await asyncio.wait_for(asyncio.gather(worker.shutdown(), worker.shutdown()), 10)
    assert running.done() and running.exception() is None


async def test_worker_keeps_retrying_an_unreachable_address_until_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dex.worker")  # each try after the first
    config = dex.WorkerConfig(reconnect_initial=0.01, reconnect_max=0.05)
    worker = dex.Worker([HELPER], f"http://127.0.0.1:{free_port()}", config)
    running = asyncio.create_task(worker.run())

    def failures() -> int:
        return sum(getattr(r, "action", None) == "worker.connect_failed" for r in caplog.records)

    async def retried() -> bool:
        if running.done():
            running.result()
            raise AssertionError("the Worker stopped by itself")
        return failures() >= 5

    await wait_until_async(retried, what="five failed connection attempts")
    assert not running.done()
    await asyncio.wait_for(worker.shutdown(), 5)
    assert running.done() and running.exception() is None
    await asyncio.wait_for(worker.shutdown(), 1)


async def test_send_and_wait_outlasts_the_servers_cap_on_waiting(tmp_path: Path) -> None:
    """The server holds a request at most ``max_wait_seconds``; the client keeps waiting
    for the rest of its own timeout."""
    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    async with (
        run_server(tmp_path / "data", max_wait_seconds=0.2) as address,
        dex.Worker([HELPER], address, FAST_WORKER),
        dex.Client(address, timeout=15) as client,
    ):

        async def registered() -> bool:
            return any(a["name"] == "helper" for a in await client.list_agents())

        await wait_until_async(registered, what="the Worker registered its agent")
        answers: list[tuple[str, str]] = []
        request = client._request

        async def recording(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            result = await request(method, path, *args, **kwargs)
            answers.append((method, result.get("status", "")))
            return result

        client._request = recording  # type: ignore[method-assign]
        session = await client.create_session("helper")
        sending = asyncio.create_task(client.send_message(session["id"], "hold", wait=True))
        await asyncio.wait_for(HOLD["entered"].wait(), 10)

        async def server_stopped_waiting() -> bool:
            return ("POST", "running") in answers

        await wait_until_async(server_stopped_waiting, what="the server's wait ran out")
        assert not sending.done()
        HOLD["open"].set()
        turn = await asyncio.wait_for(sending, 15)
    assert turn["status"] == "completed", turn
    assert _results(turn) == [["hold", "succeeded", "released", None]]
    assert turn["created"] is True


async def test_the_client_sets_lists_and_removes_a_tenant_s_budget(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    assert await client.list_tenants() == []
    acme = await client.set_tenant_budget("acme", max_cost_usd_per_month=5.0, by="ops")
    assert acme["budget"] == {
        "max_tokens_per_day": None,
        "max_cost_usd_per_day": None,
        "max_tokens_per_month": None,
        "max_cost_usd_per_month": 5.0,
    }
    assert acme["today"]["calls"] == 0 and acme["reached"] is None
    assert [t["tenant"] for t in await client.list_tenants()] == ["acme"]
    with pytest.raises(dex.InvalidInput):
        await client.set_tenant_budget("acme")  # no limit: refused, nothing changes
    assert (await client.get_tenant("acme"))["budget"] == acme["budget"]
    removed = await client.remove_tenant_budget("acme", by="ops")
    assert removed["budget"] is None
    assert await client.list_tenants() == []


async def test_send_message_on_busy_rejects_steers_and_interrupts(
    client: dex.Client, dex_worker: dex.Worker
) -> None:
    """``Client.send_message(..., on_busy=...)`` against a real server and Worker: the
    answer says what the message did, and ``wait`` waits for the turn that answers it."""
    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    sid = (await client.create_session("helper"))["id"]
    await client.send_message(sid, "hold")
    await asyncio.wait_for(HOLD["entered"].wait(), 10)

    with pytest.raises(dex.Conflict) as refused:
        await client.send_message(sid, "hurry", on_busy="reject")
    assert refused.value.details["turn"] == 1

    steering = asyncio.create_task(client.send_message(sid, "say hi", on_busy="steer", wait=True))
    await wait_until_async(
        lambda: _steered(client, sid), what="the steered message recorded in the turn"
    )
    HOLD["open"].set()
    steered = await asyncio.wait_for(steering, 15)
    assert (steered["turn"], steered["outcome"], steered["status"]) == (1, "steered", "completed")
    assert steered["text"] == "echo: say hi"  # the turn's next model call saw it

    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    await client.send_message(sid, "hold")
    await asyncio.wait_for(HOLD["entered"].wait(), 10)
    interrupting = await client.send_message(sid, "stop", on_busy="interrupt", wait=True)
    assert (interrupting["outcome"], interrupting["interrupted"]) == ("interrupted", 2)
    assert (interrupting["turn"], interrupting["status"]) == (3, "completed")
    assert (await client.wait_turn(sid, 2, timeout=0))["status"] == "cancelled"


async def _steered(client: dex.Client, sid: str) -> bool:
    turn = (await client.get_agent_snapshot(sid))["current_turn"]
    return turn is not None and turn["steered"] == ["say hi"]


async def test_dex_send_on_busy_says_what_the_message_did(
    server_address: str, client: dex.Client, dex_worker: dex.Worker
) -> None:
    """``dex send --on-busy``: a refused message exits 1 naming the turn; a steered one says
    so, and the summed-up turn is the one it joined."""
    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    sid = (await client.create_session("helper"))["id"]
    await client.send_message(sid, "hold")
    await asyncio.wait_for(HOLD["entered"].wait(), 10)

    def dex_send(*args: str) -> Any:
        return CliRunner().invoke(
            cli, ["send", sid, *args, "--address", server_address], prog_name="dex"
        )

    refused = await asyncio.to_thread(dex_send, "hurry", "--on-busy", "reject")
    assert refused.exit_code == 1 and "is running turn 1" in refused.output, refused.output
    steering = asyncio.create_task(
        asyncio.to_thread(dex_send, "say hi", "--on-busy", "steer", "--wait", "15")
    )
    await wait_until_async(lambda: _steered(client, sid), what="the steered message recorded")
    HOLD["open"].set()
    steered = await asyncio.wait_for(steering, 20)
    assert steered.exit_code == 0, steered.output
    assert "the message was steered into turn 1: its next model call sees it" in steered.output
    assert "turn 1 completed" in steered.output and "text: echo: say hi" in steered.output

"""The Worker protocol's integrity: an attempt belongs to the connection it was handed to,
a reconnecting Worker re-claims only its own attempts, a dropped Worker's attempts fail
after a short grace, and no frame can silence a connection."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from dex.errors import StorageError
from dex.testing import wait_until
from dex.wire import ModelToolCall
from dex.wire.outbox import Outbox
from dex.wire.server_frames import Ack, HeartbeatReply, ServerMessage
from tests.integration.conftest import (
    AGENT,
    Api,
    FakeWorker,
    connect_fake_worker,
    fastapi_of,
    make_api_app,
)
from tests.integration.test_api import _metrics, everything, model_done, tool_done


def test_another_connection_cannot_settle_extend_or_hand_back_an_attempt(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    aid = step["attempt_id"]
    before = everything(api)
    with connect_fake_worker(api, "intruder", agents=[]) as intruder:
        intruder.send({"t": "delta", "attempt_id": aid, "text": "forged text"})
        forged = intruder.done(aid, model_done("forged"))  # acked after the delta is handled
        assert forged["ok"] is False and "not held by this connection" in forged["error"]
        intruder.send({"t": "back", "attempt_id": aid})
        assert intruder.ack(aid)["ok"] is False
        intruder.send({"t": "fail", "attempt_id": aid, "error": {"message": "x"}})
        assert intruder.ack(aid)["ok"] is False
        assert intruder.heartbeat(aid) == {aid: "stop"}
        assert everything(api) == before
        assert _metrics(api)["dex_worker_messages_refused_total"] == 5
    # the real holder is untouched: its heartbeat is ok and its result commits
    assert worker.heartbeat(aid) == {aid: "ok"}
    assert worker.done(aid, model_done("real"))["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["status"] == "completed" and turn["text"] == "real"
    running = api.snapshot("s1")["running"]
    assert running == []


def test_a_second_connection_with_a_live_workers_id_is_refused(
    api: Api, worker: FakeWorker
) -> None:
    with (
        pytest.raises(ConnectionError, match="4409"),
        connect_fake_worker(api, "w-test"),
    ):
        pass
    with (
        pytest.raises(ConnectionError, match="4409"),
        connect_fake_worker(api, "w-test", resume="a guess"),
    ):
        pass
    assert _metrics(api)["dex_workers_connected"] == 1


def test_a_reconnecting_worker_reclaims_its_attempts_and_finishes_them(api_with_agent: Api) -> None:
    api = api_with_agent
    api.create("s1")
    api.send("s1", "hello")
    with connect_fake_worker(api) as first:
        step = first.step(session_id="s1")
        resume = first.welcome["resume"]
    aid = step["attempt_id"]
    with connect_fake_worker(api, attempts=[aid], resume=resume) as again:
        assert again.welcome["stop"] == []
        assert again.heartbeat(aid) == {aid: "ok"}
        assert again.done(aid, model_done("after a reconnect"))["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["text"] == "after a reconnect"
    ((number, outcome),) = [(a["number"], a["outcome"]) for a in turn["steps"][0]["attempts"]]
    assert (number, outcome) == (1, "succeeded")


def hand_out_a_charge(api: Api, worker: FakeWorker) -> dict[str, Any]:
    """Session ``s1``'s model asks for the single-attempt ``charge`` tool; return its
    hand-out to ``worker``."""
    api.create("s1")
    api.send("s1", "charge")
    model = worker.step(session_id="s1")
    calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
    worker.done(model["attempt_id"], model_done(tool_calls=calls))
    return worker.step(session_id="s1", tool="charge")


def test_an_attempt_a_reconnecting_worker_does_not_name_goes_back_unused(
    api_with_agent: Api,
) -> None:
    """The Worker never received it (the hand-out was lost with the connection): it goes
    out again as attempt 1, and a single-attempt tool is not marked outcome_unknown."""
    api = api_with_agent
    with connect_fake_worker(api) as first:
        charge = hand_out_a_charge(api, first)
        resume = first.welcome["resume"]
    with connect_fake_worker(api, attempts=[], resume=resume) as again:
        out_again = again.step(session_id="s1", tool="charge")
        assert out_again["attempt"] == 1 and out_again["step_id"] == charge["step_id"]
        assert again.heartbeat(out_again["attempt_id"]) == {out_again["attempt_id"]: "ok"}
        assert again.done(out_again["attempt_id"], tool_done("charged"))["ok"] is True
        final = again.step(session_id="s1", step_type="RunModel")
        again.done(final["attempt_id"], model_done("done"))
    turn = api.turn("s1", 1, wait=10)
    (call,) = turn["tool_calls"]
    assert call["status"] == "succeeded"
    charge_step = next(s for s in turn["steps"] if s["type"] == "CallSingleAttemptTool")
    assert [a["number"] for a in charge_step["attempts"]] == [1]
    assert charge_step["handed_back"] == 1


@pytest.fixture
def short_grace(tmp_path: Path) -> Iterator[Api]:
    asgi_app = make_api_app(tmp_path / "data", reconnect_grace=0.3)
    with TestClient(asgi_app) as client:
        api = Api(client, fastapi_of(asgi_app))
        api.register(AGENT)
        yield api


def test_a_dropped_workers_attempts_fail_after_the_grace_and_retry_at_once(
    short_grace: Api,
) -> None:
    api = short_grace
    api.create("s1")
    api.send("s1", "hello")
    with connect_fake_worker(api, "w-1") as first:
        step = first.step(session_id="s1")
        resume = first.welcome["resume"]
    dropped = time.monotonic()
    with connect_fake_worker(api, "w-2") as second:
        retry = second.step(session_id="s1", step_id=step["step_id"], attempt=2)
        recovered = time.monotonic() - dropped
        assert second.done(retry["attempt_id"], model_done("on w-2"))["ok"] is True
    # the heartbeat timeout is 30 s here: the grace, not the heartbeat, failed attempt 1
    assert recovered < 10
    turn = api.turn("s1", 1, wait=10)
    first_attempt = turn["steps"][0]["attempts"][0]
    assert first_attempt["outcome"] == "failed"
    assert first_attempt["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert "did not reconnect within 0.3s" in first_attempt["error"]["message"]
    # too late: the old Worker learns at once, in the welcome, to stop attempt 1
    with connect_fake_worker(api, "w-1", attempts=[step["attempt_id"]], resume=resume) as late:
        assert late.welcome["stop"] == [step["attempt_id"]]
        assert late.done(step["attempt_id"], model_done("late"))["ok"] is False
    assert api.turn("s1", 1)["text"] == "on w-2"


def test_workers_are_listed_with_what_they_serve_and_run(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    listed = api.http.get("/v1/workers")
    assert listed.status_code == 200
    (only,) = listed.json()["workers"]
    assert only["worker_id"] == "w-test"
    assert only["capacity"] == 8
    assert only["agents"] == [{"name": "echo", "tools": ["charge", "lookup"]}]
    assert only["running"] == [step["attempt_id"]]


def test_a_result_that_cannot_be_stored_is_refused_with_an_ack(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    aid = step["attempt_id"]
    before = everything(api)
    deep: Any = "bottom"
    for _ in range(150):  # parses (the parser stops at 200), but would make a state that
        deep = [deep]  # cannot be read back
    calls = [{"id": "c", "name": "lookup", "arguments": {"key": deep}}]
    message = {"t": "done", "attempt_id": aid, "result": {"text": "", "tool_calls": calls}}
    worker.ws.send_bytes(json.dumps([message]).encode())
    refused = worker.ack(aid)
    assert refused["ok"] is False and "deeper than 64 levels" in refused["error"]
    assert everything(api) == before
    # the attempt still runs: a good result commits
    assert worker.heartbeat(aid) == {aid: "ok"}
    assert worker.done(aid, model_done("fine"))["ok"] is True
    assert api.turn("s1", 1, wait=10)["text"] == "fine"


@pytest.mark.parametrize("where", ["heartbeat seq", "result"])
def test_an_integer_beyond_64_bits_closes_the_connection_and_changes_nothing(
    api_with_agent: Api, where: str
) -> None:
    """Python parses such an integer, but it can be neither stored nor sent on: once it
    silenced the connection it was echoed to, or stored a tool call that silenced every
    Worker it was handed to."""
    api = api_with_agent
    api.create("s1")
    api.send("s1", "hello")
    with connect_fake_worker(api, "big") as big:
        aid = big.step(session_id="s1")["attempt_id"]
        before = everything(api)
        if where == "heartbeat seq":
            message: dict[str, Any] = {"t": "hb", "attempts": [aid], "seq": 2**64}
        else:
            calls = [{"id": "c", "name": "lookup", "arguments": {"key": -(2**63) - 1}}]
            message = {"t": "done", "attempt_id": aid, "result": {"text": "", "tool_calls": calls}}
        big.ws.send_bytes(json.dumps([message]).encode())
        with pytest.raises(ConnectionError, match=r"'code': 4400.*integer beyond 64 bits"):
            big.expect(lambda m: m.get("t") in ("hb", "ack"), timeout=5)
    assert everything(api) == before


def test_the_largest_integers_that_fit_go_both_ways(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    aid = worker.step(session_id="s1")["attempt_id"]
    arguments = {"key": 2**64 - 1, "low": -(2**63)}
    calls = [{"id": "c", "name": "lookup", "arguments": arguments}]
    assert worker.done(aid, {"text": "", "tool_calls": calls})["ok"] is True
    assert worker.step(session_id="s1", step_type="CallTool")["arguments"] == arguments


def test_a_message_json_cannot_carry_is_dropped_and_logged_not_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Were such a value to get past the door, the connection's writer drops its message
    and goes on sending, instead of dying and leaving the Worker waiting for ever."""
    sent: list[bytes] = []

    async def send(frame: bytes, _batch: list[ServerMessage]) -> None:
        sent.append(frame)

    async def run() -> None:
        outbox: Outbox[ServerMessage] = Outbox(send)
        writer = asyncio.create_task(outbox.run())
        outbox.put(HeartbeatReply(status={}, seq=object()))  # type: ignore[arg-type]
        outbox.put(Ack(attempt_id="s1/1.1/1", ok=True))
        await asyncio.wait_for(_until(lambda: len(sent) == 1), 5)
        outbox.put(HeartbeatReply(status={}))
        await asyncio.wait_for(_until(lambda: len(sent) == 2), 5)
        writer.cancel()

    asyncio.run(run())
    assert [orjson.loads(f) for f in sent] == [
        [{"t": "ack", "attempt_id": "s1/1.1/1", "ok": True}],
        [{"t": "hb", "status": {}}],
    ]
    action = "worker.message_unencodable"
    (dropped,) = [r for r in caplog.records if r.__dict__.get("action") == action]
    assert dropped.__dict__["message_type"] == "hb"


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)


def test_a_socket_closed_before_hello_logs_one_quiet_line(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dex.workers")
    with api.http.websocket_connect("/v1/workers/connect") as ws:
        ws.close()
    wait_until(lambda: any("before its hello" in r.message for r in caplog.records), 5)
    assert not any(r.exc_info for r in caplog.records)
    assert all(r.levelno < logging.WARNING for r in caplog.records)


# --- the whole frame grammar -----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
attempt_ids = st.one_of(st.just("s1/1.1/1"), st.text(max_size=12), st.integers(), st.none())
messages = st.one_of(
    st.fixed_dictionaries(
        {"t": st.just("hb"), "attempts": st.lists(attempt_ids, max_size=3) | json_values},
        optional={"seq": json_values},
    ),
    st.fixed_dictionaries(
        {"t": st.just("delta"), "attempt_id": attempt_ids, "text": st.text() | json_values}
    ),
    st.fixed_dictionaries({"t": st.just("done"), "attempt_id": attempt_ids, "result": json_values}),
    st.fixed_dictionaries({"t": st.just("fail"), "attempt_id": attempt_ids, "error": json_values}),
    st.fixed_dictionaries({"t": st.just("back"), "attempt_id": attempt_ids}),
    st.fixed_dictionaries({"t": st.just("drain")}),
    st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    json_values,
)
frames = st.one_of(
    st.lists(messages, max_size=4).map(lambda m: json.dumps(m).encode()),
    st.binary(max_size=40),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=frames)
def test_every_frame_is_processed_or_closed_cleanly_and_others_keep_being_served(
    api: Api, worker: FakeWorker, frame: bytes
) -> None:
    """Whatever a connection sends, it gets either answers or a clean close with a reason
    code; the server keeps serving the other Workers."""
    with connect_fake_worker(api, "fuzz", agents=[]) as fuzz:
        fuzz.ws.send_bytes(frame)
        try:
            # a heartbeat for nothing is answered by a live connection
            fuzz.send({"t": "hb", "attempts": []})
            fuzz.expect(lambda m: m.get("t") == "hb" and m["status"] == {}, timeout=5)
        except ConnectionError as closed:
            assert "'code': 4400" in str(closed) and "bad frame: " in str(closed)
    # the real Worker is still served
    assert worker.heartbeat() == {}
    assert orjson.loads(api.http.get("/healthz").content) == {"status": "ok"}


# --- background work survives storage errors ---------------------------------------------------


class FlakyWrites:
    """Make the store's next ``n`` writes fail with a retryable StorageError."""

    def __init__(self, api: Api) -> None:
        self.store = api.sessions.store
        self.real = self.store.submit
        self.left = 0
        self.failed = 0

    def fail_next(self, n: int) -> None:
        self.left = n

    def submit(self, write: Any) -> asyncio.Future[None]:
        if self.left > 0:
            self.left -= 1
            self.failed += 1
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(StorageError("disk on fire (injected)", retryable=True))
            return failed
        return self.real(write)


@pytest.fixture
def flaky(short_heartbeat_api: Api, monkeypatch: pytest.MonkeyPatch) -> FlakyWrites:
    flaky = FlakyWrites(short_heartbeat_api)
    monkeypatch.setattr(flaky.store, "submit", flaky.submit)
    return flaky


@pytest.fixture
def short_heartbeat_api(tmp_path: Path) -> Iterator[Api]:
    asgi_app = make_api_app(tmp_path / "data", heartbeat_timeout=0.5, reconnect_grace=0.2)
    with TestClient(asgi_app) as client:
        api = Api(client, fastapi_of(asgi_app))
        api.register(AGENT)
        yield api


def test_an_expired_attempt_stays_held_until_its_failure_is_committed(
    short_heartbeat_api: Api, flaky: FlakyWrites
) -> None:
    api = short_heartbeat_api
    api.create("s1")
    api.send("s1", "hello")
    with connect_fake_worker(api, "w-1") as silent:
        step = silent.step(session_id="s1")
        flaky.fail_next(3)  # the failure of the expired attempt fails to commit, 3 times
        with connect_fake_worker(api, "w-2") as second:
            retry = second.step(session_id="s1", attempt=2, timeout=20)
            assert flaky.failed == 3
            assert second.done(retry["attempt_id"], model_done("after retries"))["ok"]
    assert api.turn("s1", 1, wait=10)["text"] == "after retries"
    assert _metrics(api)["dex_background_retries_total"] >= 3
    assert step["attempt_id"] not in api.sessions.dispatcher.held


def test_a_timer_whose_firing_fails_to_commit_still_fires_once(
    short_heartbeat_api: Api, flaky: FlakyWrites
) -> None:
    api = short_heartbeat_api
    api.create("s1")
    api.send("s1", "lookup")
    with connect_fake_worker(api) as worker:
        model = worker.step(session_id="s1")
        calls = [ModelToolCall(id="c1", name="lookup", arguments={})]
        worker.done(model["attempt_id"], model_done(tool_calls=calls))
        tool = worker.step(session_id="s1", tool="lookup")
        sleep = {"status": "sleep", "sleep_seconds": 1.0}
        assert worker.done(tool["attempt_id"], sleep)["ok"] is True
        flaky.fail_next(2)  # the timer's firing (and its first retry) fail to commit
        again = worker.step(session_id="s1", tool="lookup", timeout=20)
        assert again["sleeps_done"] == 1
        assert worker.done(again["attempt_id"], tool_done("slept"))["ok"]
        final = worker.step(session_id="s1", step_type="RunModel")
        worker.done(final["attempt_id"], model_done("woke up"))
    turn = api.turn("s1", 1, wait=10)
    assert turn["text"] == "woke up"
    timers = [s for s in turn["steps"] if s["type"] == "AwaitTimer"]
    assert len(timers) == 1 and timers[0]["status"] == "succeeded"
    assert flaky.failed == 2


# --- hand-outs carry only the history a Worker does not have -----------------------------------


def test_run_model_hand_outs_carry_only_new_history_to_a_worker_that_keeps_it(
    api_with_agent: Api,
) -> None:
    api = api_with_agent
    api.create("s1")
    with connect_fake_worker(api, history_cache=16) as worker:
        api.send("s1", "one")
        first = worker.step(session_id="s1")
        assert first["history_base"] == 0  # nothing sent before: the whole view
        assert [i["text"] for i in first["history"]] == ["one"]
        worker.done(first["attempt_id"], model_done("reply one"))
        api.send("s1", "two")
        second = worker.step(session_id="s1", step_type="RunModel")
        assert second["history_base"] == 1  # builds on the 1 item it was sent
        assert [i.get("text") for i in second["history"]] == ["reply one", "two"]
        # a Worker that lost the session hands it back, and gets the whole view, under the
        # same attempt id: after the ack (a Worker ignores a hand-out of an attempt it holds)
        worker.send({"t": "back", "attempt_id": second["attempt_id"], "reason": "history"})
        first = worker.expect(lambda m: m.get("attempt_id") == second["attempt_id"])
        assert first["t"] == "ack" and first["ok"] is True, first
        again = worker.step(session_id="s1", step_id=second["step_id"])
        assert again["attempt"] == 1 and again["history_base"] == 0
        assert [i.get("text") for i in again["history"]] == ["one", "reply one", "two"]
    # a Worker that keeps nothing (the default of the protocol) always gets the whole view
    # (turn 2's RunModel, failed after the first Worker left, runs again here)
    with connect_fake_worker(api, "w-plain") as plain:
        retried = plain.step(session_id="s1", step_type="RunModel", timeout=10)
        assert retried["history_base"] == 0
        assert [i.get("text") for i in retried["history"]] == ["one", "reply one", "two"]


def test_agents_say_how_many_connected_workers_serve_them(api_with_agent: Api) -> None:
    api = api_with_agent

    def serving() -> dict[str, int]:
        return {a["name"]: a["workers"] for a in api.http.get("/v1/agents").json()["agents"]}

    assert serving() == {"echo": 0}  # registered earlier, nobody serves it now
    with connect_fake_worker(api, "w-1"), connect_fake_worker(api, "w-2"):
        assert serving() == {"echo": 2}
    wait_until(lambda: serving() == {"echo": 0}, 5, what="the Workers left")


def test_a_results_ack_leaves_in_the_frame_of_the_hand_out_it_led_to(
    api: Api, worker: FakeWorker
) -> None:
    """The commit answers before its effects run, so the ack and the hand-out the commit
    made leave in one frame (a turn of model, tool, model: 4 frames, not 6)."""
    api.create("s1")
    api.send("s1", "hello")
    first = worker.step(session_id="s1")
    calls = [ModelToolCall(id="c1", name="lookup", arguments={"key": "k"})]
    worker.send({"t": "done", "attempt_id": first["attempt_id"], "result": model_done("", calls)})
    worker._receive_frame(10)
    assert sorted(m["t"] for m in worker.inbox) == ["ack", "step"]
    assert worker.ack(first["attempt_id"])["ok"] is True

"""A store that cannot commit (a full disk: SQLite's real "database or disk is full",
raised by the ``sqlite.commit`` failpoint where a full disk raises it) refuses every write
with a 503 that names the problem, acknowledges nothing it did not commit, keeps serving
reads, and recovers by itself when the fault clears. ``tests/e2e/test_storage_faults.py``
fills a real filesystem."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dex import _failpoints as failpoints
from dex.errors import StorageError
from dex.testing import wait_until
from dex.wire import ModelToolCall
from tests.integration.conftest import Api, connect_fake_worker
from tests.integration.test_api import (
    _metrics,
    assert_error,
    everything,
    model_done,
    tool_done,
)
from tests.integration.test_api_errors import GATED
from tests.integration.test_worker_protocol import hand_out_a_charge


class FullDisk:
    """The ``sqlite.commit`` failpoint, armed in this process: ``fill()`` makes every
    commit fail as on a full disk, ``free()`` ends it."""

    def __init__(self, directory: Path) -> None:
        self.switch = directory / "sqlite.commit.fail"

    def fill(self) -> None:
        self.switch.write_text("")

    def free(self) -> None:
        self.switch.unlink()


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FullDisk]:
    monkeypatch.setattr(failpoints, "_ARMED", {"sqlite.commit": ("error", 1)})
    monkeypatch.setattr(failpoints, "_COUNTS", {})
    monkeypatch.setattr(failpoints, "_DIR", tmp_path)
    yield FullDisk(tmp_path)


def test_a_full_disk_refuses_writes_with_a_503_naming_it_and_changes_nothing(
    api_with_agent: Api, disk: FullDisk
) -> None:
    api = api_with_agent
    api.create("s1")
    before = everything(api)
    disk.fill()
    refused = api.http.post("/v1/sessions", json={"agent": "echo", "session_id": "s2"})
    error = assert_error(refused, 503, "storage_error")
    assert "the disk is full" in error["message"] and "Nothing was written" in error["message"]
    assert error["details"] == {"cause": "the disk is full"}
    sent = api.http.post("/v1/sessions/s1/messages", json={"text": "hi", "message_id": "m1"})
    assert_error(sent, 503, "storage_error")
    # reads still answer, and show nothing of what was refused
    assert everything(api) == before
    assert _metrics(api)["dex_store_commit_failures_total"] >= 2
    disk.free()
    # no restart: the next write commits
    assert api.http.post("/v1/sessions", json={"agent": "echo", "session_id": "s2"}).status_code
    again = api.send("s1", "hi", message_id="m1")
    assert again["created"] is True and again["turn"] == 1


def test_a_workers_result_that_cannot_be_committed_is_acked_not_ok_and_its_attempt_fails(
    api_with_agent: Api, disk: FullDisk
) -> None:
    """A result is either committed or its attempt fails: the Worker hears ``ok: false``,
    and once the disk is free the Step runs again as attempt 2."""
    api = api_with_agent
    api.create("s1")
    api.send("s1", "hello")
    with connect_fake_worker(api) as worker:
        step = worker.step(session_id="s1")
        disk.fill()
        refused = worker.done(step["attempt_id"], model_done("lost"))
        assert refused["ok"] is False and "the disk is full" in refused["error"]
        assert api.snapshot("s1")["current_turn"]["status"] == "running"
        disk.free()
        # the Worker forgot the attempt (no heartbeat): it fails after the timeout, or at
        # once when the connection closes; this test's timeout is long, so close it
    with connect_fake_worker(api, "w-2") as second:
        retry = second.step(session_id="s1", step_id=step["step_id"], attempt=2)
        assert second.done(retry["attempt_id"], model_done("kept"))["ok"] is True
    turn = api.turn("s1", 1, wait=10)
    assert turn["text"] == "kept"
    first = turn["steps"][0]["attempts"][0]
    assert first["outcome"] == "failed" and first["error"]["attempt_progress"] == "NOT_COMPLETED"


def test_a_write_whose_result_was_refused_is_not_handed_out_again_after_a_reconnect(
    api_with_agent: Api, disk: FullDisk
) -> None:
    """The Worker ran the body and sent its result; the disk refused it (``ok: false``) and
    the Worker forgot the attempt. Reconnecting within the grace it names no attempt: that
    is not a hand-out it never received, so the single-attempt tool must not run again."""
    api = api_with_agent
    with connect_fake_worker(api) as first:
        charge = hand_out_a_charge(api, first)
        disk.fill()
        refused = first.done(charge["attempt_id"], tool_done("charged"))
        assert refused["ok"] is False and "the disk is full" in refused["error"]
        disk.free()
        resume = first.welcome["resume"]
    with connect_fake_worker(api, attempts=[], resume=resume) as again:
        following = again.step(session_id="s1")
        assert following["step_type"] == "RunModel", f"the write went out again: {following}"
        again.done(following["attempt_id"], model_done("done"))
    turn = api.turn("s1", 1, wait=10)
    (call,) = turn["tool_calls"]
    assert call["status"] == "outcome_unknown"


def test_a_hand_out_that_cannot_be_recorded_is_offered_again_when_the_disk_frees(
    api_with_agent: Api, disk: FullDisk
) -> None:
    """The Step stays queued in storage; it must stay queued in the dispatcher too, or it
    would wait for the next restart."""
    api = api_with_agent
    api.create("s1")
    api.send("s1", "hello")  # queued: no Worker yet
    disk.fill()
    with connect_fake_worker(api) as worker:
        wait_until(lambda: disk.switch.with_name("sqlite.commit.hit").exists(), 10)
        assert api.snapshot("s1")["waiting"], "the Step is still queued"
        disk.free()
        step = worker.step(session_id="s1")
        assert step["attempt"] == 1
        assert worker.done(step["attempt_id"], model_done("handed out"))["ok"] is True
    assert api.turn("s1", 1, wait=10)["text"] == "handed out"


class HeldWrite:
    """The store's next write stays in flight until the test fails it."""

    def __init__(self, api: Api) -> None:
        self.store = api.sessions.store
        self.real = self.store.submit
        self.hold_next = False
        self.held: asyncio.Future[None] | None = None

    def submit(self, write: Any) -> asyncio.Future[None]:
        if self.hold_next:
            self.hold_next = False
            self.held = asyncio.get_running_loop().create_future()
            return self.held
        return self.real(write)

    def fail(self) -> None:
        held = self.held
        assert held is not None
        error = StorageError("the disk is full (injected)", retryable=True)
        held.get_loop().call_soon_threadsafe(held.set_exception, error)


def test_a_snapshot_shows_what_is_stored_not_a_hand_out_whose_commit_is_in_flight(
    api_with_agent: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-out changes the session in memory before its commit. A snapshot read
    meanwhile waits for the commit: had it shown the attempt, a failed commit would leave
    the user looking at an attempt that never was."""
    api = api_with_agent
    api.create("s1")
    api.send("s1", "hello")  # queued: no Worker yet
    write = HeldWrite(api)
    monkeypatch.setattr(write.store, "submit", write.submit)
    write.hold_next = True
    with connect_fake_worker(api):
        wait_until(lambda: write.held is not None, 10, what="the hand-out's commit in flight")
        snapshots: list[dict[str, Any]] = []
        reader = threading.Thread(target=lambda: snapshots.append(api.snapshot("s1")))
        reader.start()
        actor = api.sessions.actors._actors["s1"]  # the one whose commit is in flight
        wait_until(lambda: actor._next or snapshots, 10, what="the snapshot asked")
        assert not snapshots, "the snapshot did not wait for the commit in flight"
        write.fail()
        reader.join(10)
    (snapshot,) = snapshots
    (step,) = snapshot["current_turn"]["steps"]
    assert step["status"] == "queued" and step["attempts"] == []  # as storage holds it
    assert [w["step_id"] for w in snapshot["waiting"]] == [step["id"]]


def test_the_approvals_list_waits_for_the_commit_of_the_wait_it_would_show(
    api_with_agent: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's call of a gated tool makes an approval wait in memory first: the
    approvals list, asked while that commit is in flight, answers once it is done, with
    what storage holds (here nothing: the commit failed)."""
    api = api_with_agent
    api.create("s1")
    api.send("s1", "charge 5")
    write = HeldWrite(api)
    monkeypatch.setattr(write.store, "submit", write.submit)
    with connect_fake_worker(api, agents=[GATED]) as worker:
        model = worker.step(session_id="s1")
        calls = [ModelToolCall(id="c1", name="charge", arguments={"amount": 5})]
        write.hold_next = True
        result = model_done(tool_calls=calls)
        worker.send({"t": "done", "attempt_id": model["attempt_id"], "result": result})
        wait_until(lambda: write.held is not None, 10, what="the wait's commit in flight")
        answers: list[Any] = []
        url = "/v1/sessions/s1/approvals"
        reader = threading.Thread(target=lambda: answers.append(api.http.get(url).json()))
        reader.start()
        actor = api.sessions.actors._actors["s1"]
        wait_until(lambda: actor._next or answers, 10, what="the approvals list asked")
        assert not answers, "the approvals list did not wait for the commit in flight"
        write.fail()
        reader.join(10)
    assert answers == [{"approvals": []}]  # the wait was never stored

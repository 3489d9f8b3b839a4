"""The fleet view over HTTP: the session list's filters and cursors, a session's status
(waiting for a person, a failed last turn, unknown outcomes), the inbox, and a wait for a
turn that returns as soon as the turn waits for a person."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dex.wire import Approval, ModelToolCall, RecoveryError, ToolKind, ToolOutcome, ToolSpec
from tests.integration.conftest import AGENT, Api, FakeWorker, connect_fake_worker
from tests.integration.test_api import assert_error, everything, model_done, tool_done

GATED = AGENT.model_copy(
    update={
        "tools": [
            ToolSpec(name="charge", kind=ToolKind.WRITE, approval=Approval.ALWAYS),
            ToolSpec(name="order", kind=ToolKind.IDEMPOTENT_WRITE),
            ToolSpec(name="book", kind=ToolKind.WRITE),
        ]
    }
)
"""``charge`` waits for an approval; ``order`` asks a question; ``book`` runs at most once."""


@pytest.fixture
def worker(api: Api) -> Iterator[FakeWorker]:
    with connect_fake_worker(api, agents=[GATED]) as fake:
        yield fake


def listed(api: Api, **params: Any) -> dict[str, Any]:
    response = api.http.get("/v1/sessions", params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def ids(api: Api, **params: Any) -> list[str]:
    return [s["id"] for s in listed(api, **params)["sessions"]]


def inbox(api: Api, **params: Any) -> dict[str, Any]:
    response = api.http.get("/v1/inbox", params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def row(api: Api, session_id: str) -> dict[str, Any]:
    sessions: list[dict[str, Any]] = listed(api, limit=1000)["sessions"]
    (found,) = [s for s in sessions if s["id"] == session_id]
    return found


def model_calls(worker: FakeWorker, session_id: str, *calls: ModelToolCall) -> None:
    step = worker.step(session_id=session_id, step_type="RunModel")
    assert worker.done(step["attempt_id"], model_done(tool_calls=list(calls)))["ok"]


def charge(amount: int) -> ModelToolCall:
    return ModelToolCall(id="c1", name="charge", arguments={"amount": amount})


def ask(worker: FakeWorker, session_id: str) -> None:
    """The model calls ``order``, which asks which size."""
    model_calls(worker, session_id, ModelToolCall(id="c1", name="order", arguments={"item": "tea"}))
    step = worker.step(session_id=session_id, tool="order")
    asked = ToolOutcome(status="asked", question="Which size?", choices=["S", "M", "L"])
    assert worker.done(step["attempt_id"], asked.model_dump(mode="json"))["ok"]


@contextlib.contextmanager
def in_background(call: Any) -> Iterator[dict[str, Any]]:
    """Run a blocking request in a thread; its answer and how long it took land in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        out["response"] = call()
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield out
    finally:
        thread.join(30)
        assert not thread.is_alive()


# --- the list -------------------------------------------------------------------------------


def test_sessions_list_newest_first_one_page_after_another(api: Api, worker: FakeWorker) -> None:
    for sid in ("a1", "b2", "c3", "d4", "e5"):
        api.create(sid)

    seen, cursor, pages = [], None, 0
    while True:
        page = listed(api, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += [s["id"] for s in page["sessions"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == ["e5", "d4", "c3", "b2", "a1"]
    assert pages == 3
    first = listed(api, limit=1)["sessions"][0]
    assert set(first) == {
        "id",
        "agent",
        "tenant",
        "status",
        "created_at",
        "updated_at",
        "waiting_since",
        "outcome_unknown",
        "usage",
    }
    assert (first["agent"], first["status"], first["outcome_unknown"]) == ("echo", "idle", 0)
    assert first["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    assert first["updated_at"] == first["created_at"]


def test_a_session_shows_running_waiting_and_back(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.create("quiet")
    api.send("s1", "charge 5")
    assert row(api, "s1")["status"] == "running"
    created = row(api, "s1")["created_at"]

    model_calls(worker, "s1", charge(5))

    waiting = row(api, "s1")
    assert waiting["status"] == "waiting" and waiting["waiting_since"] >= created
    assert waiting["updated_at"] >= waiting["waiting_since"]
    assert ids(api, status="waiting") == ["s1"]
    assert api.snapshot("s1")["session"]["status"] == "waiting"

    assert api.http.post("/v1/sessions/s1/tool_calls/1.1/approve", json={}).status_code == 200
    assert row(api, "s1")["status"] == "running"  # approved: nobody needs to act
    assert ids(api, status="waiting") == []
    step = worker.step(session_id="s1", tool="charge")
    worker.done(step["attempt_id"], tool_done("charged"))
    worker.done(worker.step(session_id="s1", step_type="RunModel")["attempt_id"], model_done("ok"))
    assert api.turn("s1", 1, wait=10)["status"] == "completed"
    assert row(api, "s1")["status"] == "idle"
    assert ids(api, status="idle") == ["quiet", "s1"]


def test_a_failed_last_turn_shows_until_the_next_turn(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    api.send("s1", "hello")
    step = worker.step(session_id="s1")
    worker.fail(step["attempt_id"], RecoveryError(message="bad request", retryable=False))
    assert api.turn("s1", 1, wait=10)["status"] == "failed"

    assert row(api, "s1")["status"] == "failed"
    snapshot = api.snapshot("s1")["session"]
    assert (snapshot["status"], snapshot["last_turn_status"]) == ("failed", "failed")
    assert ids(api, status="failed") == ["s1"]

    api.send("s1", "again")
    worker.done(worker.step(session_id="s1", step_id="2.1")["attempt_id"], model_done("fine"))
    assert api.turn("s1", 2, wait=10)["status"] == "completed"
    assert row(api, "s1")["status"] == "idle"
    assert ids(api, status="failed") == []


def test_an_unknown_outcome_lists_the_session_until_it_is_reconciled(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    api.create("other")
    api.send("s1", "book")
    model_calls(worker, "s1", ModelToolCall(id="c1", name="book", arguments={}))
    book = worker.step(session_id="s1", tool="book")
    lost = RecoveryError(message="the Worker died", attempt_progress="NOT_COMPLETED")
    worker.fail(book["attempt_id"], lost)
    worker.done(worker.step(session_id="s1", step_type="RunModel")["attempt_id"], model_done("?"))
    turn = api.turn("s1", 1, wait=10)
    assert turn["tool_calls"][0]["status"] == "outcome_unknown"

    assert ids(api, status="outcome_unknown") == ["s1"]
    assert row(api, "s1")["outcome_unknown"] == 1
    assert row(api, "s1")["status"] == "idle"
    assert api.snapshot("s1")["session"]["outcome_unknown"] == 1

    reconciled = api.http.post(
        "/v1/sessions/s1/tool_calls/1.1/reconcile", json={"status": "succeeded", "result": "ok"}
    )
    assert reconciled.status_code == 200, reconciled.text
    assert ids(api, status="outcome_unknown") == []
    assert row(api, "s1")["outcome_unknown"] == 0


def test_agent_and_time_filters(api: Api, worker: FakeWorker) -> None:
    other = AGENT.model_copy(update={"name": "other"})
    api.register(other)
    api.create("a")
    api.create("b", agent="other")
    api.create("c")
    times = {s["id"]: s["created_at"] for s in listed(api)["sessions"]}

    assert ids(api, agent="other") == ["b"]
    assert ids(api, agent="echo") == ["c", "a"]
    assert ids(api, agent="nobody") == []
    assert ids(api, created_since=times["b"]) == ["c", "b"]
    assert ids(api, created_before=times["b"]) == ["a"]
    assert ids(api, created_since=times["a"], created_before=times["c"]) == ["b", "a"]

    api.send("a", "hello")  # "a" changes: it is the latest by updated_at
    assert ids(api, order="updated") == ["a", "c", "b"]
    since = row(api, "a")["updated_at"]
    assert ids(api, order="updated", updated_since=since) == ["a"]
    assert ids(api, updated_before=since) == ["c", "b"]


BAD_QUERIES: list[tuple[dict[str, Any], str, str]] = [
    ({"status": "asleep"}, "invalid_request", "query.status"),
    ({"order": "name"}, "invalid_request", "query.order"),
    ({"limit": 0}, "invalid_request", "query.limit"),
    ({"created_since": -1}, "invalid_request", "query.created_since"),
    ({"updated_before": "nan"}, "invalid_request", "query.updated_before"),
    ({"agent": ""}, "invalid_request", "query.agent"),
    ({"cursor": "not a cursor"}, "invalid_input", ""),
    ({"cursor": "eyJhIjoxfQ"}, "invalid_input", ""),  # JSON, but not a cursor
]


@pytest.mark.parametrize(("params", "code", "where"), BAD_QUERIES)
def test_a_bad_query_is_422_and_changes_nothing(
    api: Api, worker: FakeWorker, params: dict[str, Any], code: str, where: str
) -> None:
    api.create("s1")
    before = everything(api)

    error = assert_error(api.http.get("/v1/sessions", params=params), 422, code)

    if where:
        assert where in [p["where"] for p in error["details"]["problems"]], error
    else:
        assert "cursor" in error["message"]
    assert everything(api) == before


def test_a_cursor_works_only_where_it_came_from(api: Api, worker: FakeWorker) -> None:
    for sid in ("a", "b"):
        api.create(sid)
    by_created = listed(api, limit=1)["next_cursor"]
    by_updated = listed(api, limit=1, order="updated")["next_cursor"]
    assert by_created and by_updated

    wrong_order = api.http.get("/v1/sessions", params={"cursor": by_created, "order": "updated"})
    assert "order=created" in assert_error(wrong_order, 422, "invalid_input")["message"]
    assert_error(api.http.get("/v1/inbox", params={"cursor": by_created}), 422, "invalid_input")
    assert ids(api, cursor=by_updated, order="updated") == ["a"]


# --- the inbox -------------------------------------------------------------------------------


def test_the_inbox_lists_what_waits_for_a_person_across_sessions(
    api: Api, worker: FakeWorker
) -> None:
    for sid in ("approve-me", "answer-me", "busy"):
        api.create(sid)
        api.send(sid, "go")
    model_calls(worker, "approve-me", charge(7))
    ask(worker, "answer-me")  # waits after approve-me: it comes first

    items = inbox(api)["items"]

    assert [(i["session_id"], i["kind"]) for i in items] == [
        ("answer-me", "question"),
        ("approve-me", "approval"),
    ]
    question, approval = items
    assert (question["tool"], question["question"], question["choices"]) == (
        "order",
        "Which size?",
        ["S", "M", "L"],
    )
    assert (approval["call_id"], approval["tool"], approval["arguments"]) == (
        "1.1",
        "charge",
        {"amount": 7},
    )
    assert approval["agent"] == "echo" and approval["turn"] == 1 and approval["arguments_hash"]
    first = inbox(api, limit=1)
    assert [i["session_id"] for i in first["items"]] == ["answer-me"]
    second = inbox(api, limit=1, cursor=first["next_cursor"])
    assert [i["session_id"] for i in second["items"]] == ["approve-me"]
    assert second["next_cursor"] is None

    answered = api.http.post("/v1/sessions/answer-me/tool_calls/1.1/answer", json={"answer": "M"})
    assert answered.status_code == 200, answered.text
    assert [i["session_id"] for i in inbox(api)["items"]] == ["approve-me"]
    assert_error(api.http.get("/v1/inbox", params={"cursor": "x"}), 422, "invalid_input")


# --- a wait that returns at an interrupt ------------------------------------------------


def test_a_waiting_send_returns_as_soon_as_the_turn_waits_for_an_approval(
    api: Api, worker: FakeWorker
) -> None:
    api.create("s1")
    with in_background(lambda: api.send("s1", "charge 5", wait_seconds=60)) as sent:
        model_calls(worker, "s1", charge(5))
    turn = sent["response"]

    assert sent["seconds"] < 30
    assert turn["status"] == "waiting" and turn["created"] is True
    (wait,) = turn["waiting_for"]
    assert (wait["kind"], wait["call_id"], wait["tool"], wait["arguments"]) == (
        "approval",
        "1.1",
        "charge",
        {"amount": 5},
    )
    assert [c["status"] for c in turn["tool_calls"]] == ["pending"]

    # a wait on the turn answers at once while it still waits
    again = api.turn("s1", 1, wait=60)
    assert again["status"] == "waiting" and again["waiting_for"] == turn["waiting_for"]

    # once approved, a wait holds until the turn ends
    api.http.post("/v1/sessions/s1/tool_calls/1.1/approve", json={})
    with in_background(lambda: api.turn("s1", 1, wait=60)) as waited:
        worker.done(worker.step(session_id="s1", tool="charge")["attempt_id"], tool_done("ok"))
        final = worker.step(session_id="s1", step_type="RunModel")
        worker.done(final["attempt_id"], model_done("charged"))
    assert waited["response"]["status"] == "completed"
    assert waited["response"]["waiting_for"] == []


def test_a_waiting_send_returns_with_the_question_a_tool_asks(api: Api, worker: FakeWorker) -> None:
    api.create("s1")
    with in_background(lambda: api.send("s1", "order tea", wait_seconds=60)) as sent:
        ask(worker, "s1")
    turn = sent["response"]

    assert sent["seconds"] < 30
    assert turn["status"] == "waiting"
    (wait,) = turn["waiting_for"]
    assert (wait["kind"], wait["question"], wait["choices"]) == (
        "question",
        "Which size?",
        ["S", "M", "L"],
    )

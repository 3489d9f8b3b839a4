"""PollToolTask and CompactContext: a crash between two polls lets polling go on with the
same task; a crash during a poll, or during a summary call, runs only that call again."""

from __future__ import annotations

import time
from typing import Any

from dex.testing import wait_until
from tests.crash.helpers import columns, interrupt
from tests.support.rig import HEARTBEAT_TIMEOUT, Rig, attempts, model_calls, results


def gate_name(handle: str) -> str:
    return handle.replace("/", "_")


def step_of(turn: dict[str, Any], type_: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [s for s in turn["steps"] if s["type"] == type_]
    (step,) = steps
    return step


# --- PollToolTask ----------------------------------------------------------------------------


@columns("poll_tool_task.between_polls", takeover=True, typescript=True, go=True)
def test_task_interrupted_between_polls_goes_on_polling_the_same_task(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("export", {"report": "q3"}))  # polled once a second

    def between_polls() -> dict[str, Any] | None:
        step = rig.current_step(sid, "PollToolTask")
        if step is None or step["status"] != "queued" or step["polls"] < 1:
            return None
        # a poll found the task running, and the next one is not due for a while
        return step if step["not_before"] - time.time() > 0.5 else None

    waiting = wait_until(between_polls, 20, what="the task is waiting between two polls")
    assert waiting is not None
    polled_before = len(rig.ledger.entries("export.poll"))

    interrupt(rig, column, worker)
    (start,) = rig.ledger.entries("export.start")
    handle = start["idempotency_key"]
    (rig.gates / f"{gate_name(handle)}.done").write_text("")  # the task finishes
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert len(rig.ledger.entries("export.start")) == 1  # no second task
    polls = rig.ledger.entries("export.poll")
    assert len(polls) > polled_before  # polling went on after the interrupt
    assert {p["handle"] for p in polls} == {handle}  # the same task
    # no poll was interrupted: one attempt each, numbered on across polls
    assert [p["attempt"] for p in polls] == list(range(1, len(polls) + 1))
    assert [s["type"] for s in t["steps"]] == ["RunModel", "CallTool", "PollToolTask", "RunModel"]
    poll = step_of(t, "PollToolTask")
    assert poll["id"] == waiting["id"]  # the same Step polled on
    assert poll["polls"] == len(polls) - 1  # every poll but the last found it running
    assert attempts(t, "PollToolTask") == [[(n, "succeeded") for n in range(1, len(polls) + 1)]]
    (call,) = t["tool_calls"]
    assert call["task_handle"] == handle
    assert results(t) == [
        {"name": "export", "status": "succeeded", "result": f"exported {handle}", "error": None}
    ]


@columns("poll_tool_task.during_poll", takeover=True, typescript=True, go=True)
def test_task_interrupted_during_a_poll_polls_again_and_starts_no_second_task(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("render", {"scene": "intro"}))
    (start,) = wait_until(lambda: rig.ledger.entries("render.start"), 10, what="the task started")
    handle = start["idempotency_key"]
    gate = gate_name(handle)
    (rig.gates / f"{gate}.pause").write_text("")  # the next poll holds
    wait_until(lambda: (rig.gates / f"{gate}.polling").exists(), 10, what="a poll runs, held")

    interrupt(rig, column, worker)
    wait_until(
        lambda: any(p["attempt"] == 2 for p in rig.ledger.entries("render.poll")),
        20,
        what="the interrupted poll runs again",
    )
    (rig.gates / f"{gate}.done").write_text("")
    (rig.gates / f"{gate}.open").write_text("")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert len(rig.ledger.entries("render.start")) == 1  # no second task
    polls = rig.ledger.entries("render.poll")
    assert {p["handle"] for p in polls} == {handle}
    assert [p["attempt"] for p in polls] == [1, 2]  # that one poll ran again, once
    assert attempts(t, "PollToolTask") == [[(1, "failed"), (2, "succeeded")]]
    failed = step_of(t, "PollToolTask")["attempts"][0]
    assert failed["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert results(t) == [
        {"name": "render", "status": "succeeded", "result": f"rendered {handle}", "error": None}
    ]


@columns("read_poll_compact.before_heartbeat", takeover=True, typescript=True, go=True)
def test_poll_interrupted_before_first_heartbeat_polls_again(rig: Rig, column: str) -> None:
    rig.start_server()
    # the 1st tool Step is the task's start, the 2nd its first poll
    worker = rig.start_worker(failpoints="worker.before_first_heartbeat=pause@2")
    sid = rig.session("waiter")
    turn = rig.call(sid, ("render", {"scene": "outro"}))
    rig.wait_failpoint("worker.before_first_heartbeat")
    (start,) = rig.ledger.entries("render.start")
    handle = start["idempotency_key"]
    (rig.gates / f"{gate_name(handle)}.done").write_text("")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.before_first_heartbeat")  # a still-running Worker goes on
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert len(rig.ledger.entries("render.start")) == 1
    assert attempts(t, "PollToolTask") == [[(1, "failed"), (2, "succeeded")]]
    polls = rig.ledger.entries("render.poll")
    assert {p["handle"] for p in polls} == {handle}
    # A killed Worker never ran poll 1; one that ran on through a takeover ran it late (its
    # result was refused). The poll ran again as attempt 2 either way.
    # (in a cluster, in either order: the new owner may hand attempt 2 to the paused Worker)
    assert sorted(p["attempt"] for p in polls) == [2]
    assert results(t)[0]["result"] == f"rendered {handle}"


# --- CompactContext --------------------------------------------------------------------------

FIRST = "first " + "x" * 300  # past the agents' threshold of 400 characters with its answer


def compacted_turn(rig: Rig, agent: str) -> tuple[str, dict[str, Any], int]:
    """A session whose first turn filled the context, and a second turn that compacts it."""
    sid = rig.session(agent)
    first = rig.wait_turn(sid, rig.client.send_message(sid, FIRST)["turn"])
    assert first["status"] == "completed"
    return sid, first, rig.client.send_message(sid, "second")["turn"]


def assert_compacted_once(
    rig: Rig, sid: str, first: dict[str, Any], t: dict[str, Any]
) -> dict[str, Any]:
    """Only the summary ran again; the session stores one summary; the model saw it and
    the turn's own message."""
    assert t["status"] == "completed" and t["text"] == "echo: second"
    assert [s["type"] for s in t["steps"]] == ["CompactContext", "RunModel"]
    assert attempts(t, "CompactContext") == [[(1, "failed"), (2, "succeeded")]]
    compact = step_of(t, "CompactContext")
    assert compact["attempts"][0]["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert attempts(t, "RunModel") == [[(1, "succeeded")]]
    # the model's own count: one call in each turn, none again
    assert model_calls(rig, sid) == [1, 1]
    assert rig.client.wait_turn(sid, 1) == first  # the earlier turn ran nothing again
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history] == ["user", "assistant", "user", "summary", "assistant"]
    summary = history[3]
    assert FIRST in summary["text"] and "second" not in summary["text"]
    return dict(summary)


@columns("compact_context.during_summary", takeover=True, typescript=True, go=True)
def test_compaction_interrupted_during_the_summary_call_runs_only_the_summary_again(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid, first, turn = compacted_turn(rig, "slow_summaries")  # its summaries wait at a gate
    rig.wait_entered("summary", 1)
    # The summary call runs: its Worker's heartbeats keep the attempt alive past the timeout.
    (compact,) = rig.client.get_agent_snapshot(sid)["current_turn"]["steps"]
    started = compact["attempts"][0]["started_at"]
    wait_until(
        lambda: time.time() > started + 1.5 * HEARTBEAT_TIMEOUT, 5, what="heartbeats reached Dex"
    )
    assert rig.current_step(sid, "CompactContext") == compact  # still attempt 1, running

    interrupt(rig, column, worker)
    rig.wait_entered("summary", 2)
    rig.open_gate("summary")
    t = rig.wait_turn(sid, turn)

    assert model_calls(rig, sid, "summary") == [1, 2]  # the model's own count
    assert_compacted_once(rig, sid, first, t)


@columns("read_poll_compact.before_heartbeat", takeover=True, typescript=True, go=True)
def test_compaction_interrupted_before_first_heartbeat_runs_the_summary_again(
    rig: Rig, column: str
) -> None:
    rig.start_server()
    # the Worker stops dead as it starts the summary call: no heartbeat for it leaves
    worker = rig.start_worker(failpoints="worker.compact_context.running=pause")
    sid, first, turn = compacted_turn(rig, "compactor")
    rig.wait_failpoint("worker.compact_context.running")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.compact_context.running")
    t = rig.wait_turn(sid, turn)

    assert_compacted_once(rig, sid, first, t)
    # The model's own count. A killed Worker stopped before attempt 1's summary call; a
    # Worker that ran on through a takeover, released, made it late (its result was refused), then
    # attempt 2's.
    # (in a cluster, in either order: the new owner may hand attempt 2 to the paused Worker)
    summaries = sorted(model_calls(rig, sid, "summary"))
    assert summaries == [2]

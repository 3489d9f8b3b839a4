"""RunModel: a crash before or after output reached Dex runs that model call again."""

from __future__ import annotations

from dex.testing import wait_until
from tests.crash.helpers import columns, interrupt
from tests.support.rig import Rig, attempts, model_calls


@columns("run_model.before_output", takeover=True, typescript=True, go=True)
def test_model_call_interrupted_before_output_runs_again(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker(failpoints="worker.run_model.before_output=pause")
    sid = rig.session()
    turn = rig.client.send_message(sid, "hello")["turn"]
    rig.wait_failpoint("worker.run_model.before_output")

    interrupt(rig, column, worker)
    rig.release_failpoint("worker.run_model.before_output")
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert t["text"] == "echo: hello"
    assert attempts(t, "RunModel") == [[(1, "failed"), (2, "succeeded")]]
    # The model's own count. A killed Worker stopped before attempt 1's call; a Worker
    # that ran on through a takeover, released, made attempt 1's call late (its result was
    # refused: that attempt had failed) and then attempt 2's, each once.
    # (in a cluster, in either order: the new owner may hand attempt 2 to the paused Worker)
    assert sorted(model_calls(rig, sid)) == [2]
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history] == ["user", "assistant"]  # no duplicate answer


@columns("run_model.after_output", takeover=True, typescript=True, go=True)
def test_model_call_interrupted_after_output_reached_dex_runs_again(rig: Rig, column: str) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session("streamer")  # streams 4 characters every 10 ms
    text = "a long answer " * 30
    turn = rig.client.send_message(sid, text)["turn"]

    def output_reached_dex() -> bool:
        running = rig.client.get_agent_snapshot(sid)["running"]
        return any(r["output_chars"] > 0 for r in running)

    wait_until(output_reached_dex, 20, what="model output reached the server")
    interrupt(rig, column, worker)
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert t["text"] == f"echo: {text}"
    assert attempts(t, "RunModel") == [[(1, "failed"), (2, "succeeded")]]
    # attempt 1's call was under way (a Worker that ran on through a takeover streamed it to its
    # end, to nobody), and the call ran again once as attempt 2
    assert model_calls(rig, sid) == [1, 2]
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["type"] for i in history] == ["user", "assistant"]

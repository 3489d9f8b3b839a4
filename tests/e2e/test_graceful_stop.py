"""A node's graceful stop (SIGTERM): it hands out nothing new and fires no timer, keeps
answering the API, lets running attempts finish within its drain timeout, fails what is
left, and exits; a restarted node carries on with what was queued."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from typing import Any

from dex.testing import wait_until
from tests.support.rig import Rig, attempts, metric, results


def readyz(rig: Rig) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(rig.server.address + "/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_tool_that_finishes_within_the_drain_is_not_failed(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    assert rig.server.proc is not None
    rig.server.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: readyz(rig) == (503, {"status": "not ready", "role": "draining"}), 10)
    # the API keeps answering while it drains: a new message queues as turn 2
    queued = rig.client.send_message(sid, "after the stop")
    assert queued["turn"] == 2
    rig.open_gate("g")  # the running tool finishes within the drain timeout
    assert rig.server.proc.wait(30) == 0
    assert "drained" in rig.server.output()

    rig.start_server()  # the same data directory: turn 1 goes on, then turn 2
    t = rig.wait_turn(sid, turn)
    assert [e["attempt"] for e in rig.ledger.entries("upsert")] == [1]
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert results(t)[0]["status"] == "succeeded"
    assert rig.wait_turn(sid, 2)["text"] == "echo: after the stop"


def test_an_attempt_still_running_at_the_drain_timeout_fails_and_runs_again(rig: Rig) -> None:
    rig.server.env["DEX_SERVER_DRAIN_TIMEOUT"] = "0.5"
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    assert rig.server.proc is not None
    rig.server.proc.send_signal(signal.SIGTERM)
    assert rig.server.proc.wait(30) == 0

    rig.start_server()
    rig.wait_entered("g", 2)  # the read runs again, on the Worker that outlived the node
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)
    (failed, succeeded) = next(s for s in t["steps"] if s["type"] == "CallTool")["attempts"]
    assert failed["outcome"] == "failed" and succeeded["outcome"] == "succeeded"
    assert "drain timeout (0.5s) passed" in failed["error"]["message"]
    assert failed["error"]["attempt_progress"] == "NOT_COMPLETED"
    assert results(t)[0]["status"] == "succeeded"


def read_in_background(url: str) -> tuple[threading.Thread, dict[str, Any]]:
    """GET ``url`` to the end of its response in a thread: the dict gets its ``status`` and
    ``body``, or the ``error`` that cut it."""
    got: dict[str, Any] = {}

    def read() -> None:
        try:
            with urllib.request.urlopen(url, timeout=90) as r:
                got.update(status=r.status, body=r.read())
        except Exception as e:  # reported by the caller's assertions
            got.update(error=repr(e))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_a_request_waiting_for_a_turn_is_answered_when_the_node_stops(rig: Rig) -> None:
    """Its client moves on to the node that serves next at once, instead of holding a
    long poll to a node that hands nothing out any more until the poll times out."""
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)
    url = f"{rig.server.address}/v1/sessions/{sid}/turns/{turn}?wait_seconds=60"
    poller, answer = read_in_background(url)
    wait_until(lambda: metric(rig, "dex_turn_waits") == 1, 10, what="the long poll held")

    assert rig.server.proc is not None
    rig.server.proc.send_signal(signal.SIGTERM)
    rig.open_gate("g")  # the attempt finishes within the drain; nothing new is handed out
    poller.join(30)
    # answered by the node as it stopped, not dropped by its exit (uvicorn gives open
    # requests 5 s, less than the 60 s the poll asked for)
    assert answer.get("status") == 200, answer
    assert json.loads(answer["body"])["status"] == "running"
    assert rig.server.proc.wait(30) == 0

    rig.start_server()  # the turn goes on where it was
    assert rig.wait_turn(sid, turn)["status"] == "completed"


def test_a_live_event_stream_ends_when_the_node_stops(rig: Rig) -> None:
    """Its subscriber reconnects (with ``Last-Event-ID``) to the node that serves next at
    once, and the stopping node exits without waiting out uvicorn's shutdown for it."""
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    follower, ended = read_in_background(f"{rig.server.address}/v1/sessions/{sid}/events")
    wait_until(lambda: metric(rig, "dex_stream_subscribers") == 1, 10, what="subscribed")

    assert rig.server.proc is not None
    rig.server.proc.send_signal(signal.SIGTERM)
    follower.join(30)
    # ended by the node as it stopped, not cut by its exit
    assert ended.get("status") == 200, ended
    assert rig.server.proc.wait(30) == 0
    assert "drained" in rig.server.output()

"""Logs that explain a failure: a failed tool attempt's Worker log line names the tool,
the session and the attempt, carries the traceback, and is one JSON object when asked."""

from __future__ import annotations

import json

from tests.support.rig import Rig


def test_a_failed_tool_attempt_is_logged_with_its_ids_and_traceback(rig: Rig) -> None:
    rig.start_server()
    worker = rig.start_worker(env={"DEX_LOG_FORMAT": "json"})
    sid = rig.session()
    t = rig.wait_turn(sid, rig.call(sid, ("flaky", {})))
    assert t["steps"][1]["attempts"][0]["error"]["message"] == (
        "RuntimeError: flaky failure on attempt 1"  # type and message, not the traceback
    )
    lines = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    failed = [e for e in lines if e.get("action") == "worker.attempt_failed"]
    assert len(failed) == 2
    first = failed[0]
    assert first["level"] == "warning" and first["tool"] == "flaky"
    assert first["session_id"] == sid and first["attempt_id"].endswith("/1")
    assert first["call_id"] == "1.1" and first["step_id"] == t["steps"][1]["id"]
    assert first["worker_id"] == t["steps"][1]["attempts"][0]["worker_id"]  # as in the snapshot
    assert "RuntimeError: flaky failure on attempt 1" in first["traceback"]
    assert "Traceback (most recent call last)" in first["traceback"]


def test_a_call_whose_outcome_becomes_unknown_is_logged_once_with_why(rig: Rig) -> None:
    rig.server.env["DEX_LOG_FORMAT"] = "json"
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(sid, ("charge", {"amount": 30, "gate": "g"}))
    rig.wait_entered("g", 1)

    worker.kill()  # SIGKILL while the write runs: it may have charged
    rig.start_worker()  # runs the model once the call has failed
    t = rig.wait_turn(sid, turn)
    assert t["tool_calls"][0]["status"] == "outcome_unknown"
    rig.wait_turn(sid, rig.client.send_message(sid, "anything else?")["turn"])

    lines = [json.loads(line) for line in rig.server.output().splitlines() if line.startswith("{")]
    [logged] = [e for e in lines if e.get("action") == "tool_call.outcome_unknown"]
    assert logged["level"] == "warning"
    assert logged["session_id"] == sid and logged["call_id"] == "1.1"
    assert logged["tool"] == "charge" and logged["step_id"] == t["steps"][1]["id"]
    assert "attempt 1 failed NOT_COMPLETED" in logged["why"]
    assert "a single attempt allowed" in logged["why"]
    assert f"dex reconcile {sid} 1.1" in logged["message"]

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

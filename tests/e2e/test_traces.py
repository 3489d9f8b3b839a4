"""``dex server --tracing`` and ``dex worker --tracing`` as processes: the spans each one
exports (OTEL_TRACES_EXPORTER=console, into its log) make one trace per turn, the
Worker's tool span under the server's attempt span."""

from __future__ import annotations

import json
from typing import Any

from tests.support.rig import Rig

TRACED = {"DEX_TRACING": "true", "OTEL_TRACES_EXPORTER": "console"}


def spans(log: str) -> list[dict[str, Any]]:
    """The spans a console exporter printed among the log lines."""
    decoder = json.JSONDecoder()
    found = []
    at = log.find('{\n    "name"')
    while at != -1:
        span, end = decoder.raw_decode(log, at)
        found.append(span)
        at = log.find('{\n    "name"', end)
    return found


def test_the_dex_commands_export_one_trace_per_turn_across_processes(rig: Rig) -> None:
    rig.server.env.update(TRACED)
    rig.start_server()
    worker = rig.start_worker(env={**TRACED, "OTEL_SERVICE_NAME": "my-workers"})
    sid = rig.session()
    turn = rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "k"})))
    assert turn["status"] == "completed"
    assert worker.terminate() == 0 and rig.server.terminate() == 0  # both flush on the way out

    server_spans = spans(rig.server.output())
    worker_spans = spans(worker.output())
    (root,) = [s for s in server_spans if s["name"] == "dex.turn"]
    trace_id = root["context"]["trace_id"]
    assert root["attributes"]["dex.session_id"] == sid
    assert root["resource"]["attributes"]["service.name"] == "dex-server"
    (tool_step,) = [s for s in server_spans if s["name"] == "CallTool lookup"]
    assert tool_step["parent_id"] == root["context"]["span_id"]
    (attempt,) = [
        s
        for s in server_spans
        if s["name"] == "attempt" and s["parent_id"] == tool_step["context"]["span_id"]
    ]
    (tool,) = [s for s in worker_spans if s["name"] == "dex.tool lookup"]
    assert tool["context"]["trace_id"] == trace_id
    assert tool["parent_id"] == attempt["context"]["span_id"]  # across the WebSocket
    assert tool["resource"]["attributes"]["service.name"] == "my-workers"
    models = [s for s in worker_spans if s["name"] == "dex.model assistant"]
    assert len(models) == 2 and {s["context"]["trace_id"] for s in models} == {trace_id}

"""A burst of model text becomes one event, not one per token: the Worker joins the deltas
that wait for its link, and the server joins consecutive deltas of one attempt in a frame
(a Worker in another language may not join them)."""

from __future__ import annotations

from typing import Any, cast

from dex.server.api.workers import _joined
from dex.wire.worker_frames import Delta, Heartbeat, WorkerMessage
from dex.worker.worker import _Link


def test_the_server_joins_consecutive_deltas_of_one_attempt_and_keeps_the_order() -> None:
    a, b = "s/1/1", "s/2/1"
    frame: list[WorkerMessage] = [
        Delta(attempt_id=a, text="he"),
        Delta(attempt_id=a, text="llo"),
        Delta(attempt_id=b, text="x"),
        Heartbeat(attempts=[a]),
        Delta(attempt_id=a, text="!"),
    ]
    joined = _joined(frame)
    assert [(type(m).__name__, getattr(m, "text", None)) for m in joined] == [
        ("Delta", "hello"),
        ("Delta", "x"),
        ("Heartbeat", None),
        ("Delta", "!"),
    ]


def test_the_worker_joins_the_deltas_that_wait_for_its_link() -> None:
    link = _Link(ws=cast(Any, None), address="http://node", heartbeat_interval=1.0)
    link.put({"t": "delta", "attempt_id": "s/1/1", "text": "he"})
    link.put({"t": "delta", "attempt_id": "s/1/1", "text": "llo"})
    link.put({"t": "hb", "attempts": ["s/1/1"]})
    link.put({"t": "delta", "attempt_id": "s/1/1", "text": "!"})
    assert [m.get("text") for m in link.pending] == ["hello", None, "!"]

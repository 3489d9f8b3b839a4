"""A burst of model text becomes one event, not one per token: the Worker joins the deltas
that wait for its link, and the server joins consecutive deltas of one attempt in a frame
(a Worker in another language may not join them)."""

from __future__ import annotations

from dex.server.api.workers import _joined
from dex.wire.outbox import Outbox
from dex.wire.worker_frames import Delta, Heartbeat, WorkerMessage


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
    async def never(frame: bytes, batch: list[WorkerMessage]) -> None:
        raise AssertionError("nothing is sent: the messages wait")

    outbox: Outbox[WorkerMessage] = Outbox(never)  # the link's
    outbox.put(Delta(attempt_id="s/1/1", text="he"))
    outbox.put(Delta(attempt_id="s/1/1", text="llo"))
    outbox.put(Heartbeat(attempts=["s/1/1"]))
    outbox.put(Delta(attempt_id="s/1/1", text="!"))
    assert [getattr(m, "text", None) for m in outbox.pending] == ["hello", None, "!"]

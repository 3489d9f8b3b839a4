"""The server's frames are msgspec structs (``dex.wire.server_frames``), the protocol's one
definition: the Worker reads what fits, with the defaults of what a message leaves out,
and refuses what does not fit (each field's JSON type as it is)."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest

from dex.wire import ITEMS, StepType
from dex.wire import server_frames as frames
from dex.wire.outbox import encode

RUN_MODEL = {
    "t": "step",
    "attempt_id": "s/1.1/1",
    "session_id": "s",
    "step_id": "1.1",
    "step_type": "RunModel",
    "attempt": 1,
    "agent": "a",
    "history": [
        {"type": "user", "text": "hi"},
        {"type": "assistant", "text": "", "tool_calls": [{"id": "c", "name": "t"}]},
        {"type": "tool_result", "call_id": "c", "name": "t", "status": "succeeded"},
    ],
    "history_base": 2,
    "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
}
CALL_TOOL = {
    "t": "step",
    "attempt_id": "s/1.2/1",
    "session_id": "s",
    "step_id": "1.2",
    "step_type": "CallSingleAttemptTool",
    "attempt": 2,
    "agent": "a",
    "tool": "book",
    "call_id": "c",
    "arguments": {"when": [1, {"x": None}]},
    "idempotency_key": "s/c",
    "needs_start_ack": True,
    "answers": ["yes"],
    "sleeps_done": 1,
    "task_handle": {"id": 7},
}
VALID: list[dict[str, Any]] = [
    {
        "t": "welcome",
        "worker_id": "w",
        "heartbeat_timeout": 10,
        "reconnect_grace": 1.5,
        "resume": "r",
        "stop": ["s/1.1/1"],
    },
    {
        "t": "welcome",
        "worker_id": "w",
        "heartbeat_timeout": 10.0,
        "reconnect_grace": 1,
        "resume": "r",
    },
    RUN_MODEL,
    CALL_TOOL,
    {
        "t": "step",
        "attempt_id": "a",
        "session_id": "s",
        "step_id": "1",
        "step_type": "CallTool",
        "attempt": 1,
        "agent": "a",
    },
    {"t": "hb", "status": {"s/1.1/1": "ok", "s/1.2/1": "stop"}, "seq": 3},
    {"t": "hb", "status": {}},
    {"t": "ack", "attempt_id": "s/1.1/1", "ok": True},
    {"t": "ack", "attempt_id": "s/1.1/1", "ok": False, "error": "not running"},
    {"t": "cancel", "attempt_id": "s/1.1/1"},
]
INVALID: list[Any] = [
    {"t": "shutdown"},  # no such message
    {"attempt_id": "s/1.1/1", "ok": True},  # no type
    {"t": "ack", "attempt_id": "s/1.1/1"},  # a required field missing
    {"t": "ack", "attempt_id": "s/1.1/1", "ok": True, "extra": 1},  # an unknown field
    {"t": "ack", "attempt_id": 7, "ok": True},
    {"t": "hb", "status": {"s/1.1/1": "maybe"}},
    {"t": "hb", "status": ["s/1.1/1"]},
    {
        "t": "welcome",
        "worker_id": "w",
        "heartbeat_timeout": "soon",
        "reconnect_grace": 1,
        "resume": "r",
    },
    {
        "t": "welcome",
        "worker_id": "w",
        "heartbeat_timeout": 1,
        "reconnect_grace": 1,
        "resume": "r",
        "stop": [""],
    },
    {
        "t": "welcome",
        "worker_id": "w",
        "heartbeat_timeout": 1,
        "reconnect_grace": 1,
        "resume": "r",
        "stop": ["x" * 513],
    },
    {**CALL_TOOL, "step_type": "Nap"},
    {**CALL_TOOL, "answers": "yes"},
    {**CALL_TOOL, "arguments": []},
    {**CALL_TOOL, "surprise": True},
    {**RUN_MODEL, "traceparent": "0" * 513},
    "ack",
]
STRICTER: list[dict[str, Any]] = [
    {**CALL_TOOL, "attempt": "2"},
    {**RUN_MODEL, "history_base": "2"},
]
"""What a lax reader would coerce (a number sent as a string): refused. The server never
sends a number as a string."""


@pytest.mark.parametrize("message", VALID, ids=lambda m: f"{m['t']}")
def test_a_valid_message_reads_as_it_was_sent(message: dict[str, Any]) -> None:
    (struct,) = frames.decode(orjson.dumps([message]))
    read = {"t": message["t"], **msgspec.structs.asdict(struct)}
    if isinstance(struct, frames.Step):  # the history stays JSON until the Worker needs it
        raw = read.pop("history")
        if "history" in message:
            assert ITEMS.validate_json(bytes(raw)) == ITEMS.validate_python(message["history"])
        else:
            assert raw is msgspec.UNSET
    assert {k: read[k] for k in message if k != "history"} == {
        k: v for k, v in message.items() if k != "history"
    }
    assert frames.decode(encode([struct])) == frames.decode(orjson.dumps([message]))


def test_what_a_message_leaves_out_reads_as_its_default() -> None:
    welcome, step, hb, ack = frames.decode(
        b'[{"t": "welcome", "worker_id": "w", "heartbeat_timeout": 1, "reconnect_grace": 1,'
        b' "resume": "r"}, {"t": "step", "attempt_id": "a", "session_id": "s", "step_id": "1",'
        b' "step_type": "CallTool", "attempt": 1, "agent": "a"}, {"t": "hb", "status": {}},'
        b' {"t": "ack", "attempt_id": "a", "ok": true}]'
    )
    assert isinstance(welcome, frames.Welcome) and welcome.stop == []
    assert isinstance(step, frames.Step) and step.step_type is StepType.CALL_TOOL
    defaults = (step.tool, step.call_id, step.arguments, step.idempotency_key)
    assert defaults == (None, None, {}, None)
    assert (step.needs_start_ack, step.answers, step.sleeps_done) == (False, [], 0)
    assert (step.task_handle, step.history_base, step.traceparent) == (None, 0, None)
    assert step.history is msgspec.UNSET
    assert isinstance(hb, frames.HeartbeatReply) and hb.seq is None
    assert isinstance(ack, frames.Ack) and ack.error is None


@pytest.mark.parametrize("message", INVALID)
def test_what_the_protocol_refuses_the_worker_refuses(message: Any) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode(orjson.dumps([message]))


@pytest.mark.parametrize("message", STRICTER)
def test_a_number_sent_as_a_string_is_refused(message: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode(orjson.dumps([message]))


def test_a_frame_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError):
        frames.decode(b'[{"t": "ack"')

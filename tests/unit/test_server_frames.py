"""The Worker decodes the server's frames with msgspec structs (``dex.wire.server_frames``)
that mirror the protocol's pydantic types (``SERVER_FRAME``, from which the protocol's
page is generated): they must have the same fields and defaults, read valid frames the
same way and refuse what the protocol refuses."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import orjson
import pydantic
import pytest

from dex.wire import ITEMS
from dex.wire import protocol as p
from dex.wire import server_frames as frames
from tests.support.mirrors import (
    coerced_by_pydantic_only,
    model_fields,
    refused_by_both,
    struct_fields,
)

PAIRS: list[tuple[type[pydantic.BaseModel], type[msgspec.Struct]]] = [
    (p.Welcome, frames.Welcome),
    (p.StepMessage, frames.Step),
    (p.HeartbeatReply, frames.HeartbeatReply),
    (p.Ack, frames.Ack),
    (p.Cancel, frames.Cancel),
]

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
"""What pydantic's lax mode coerces (a number sent as a string) and msgspec refuses: the
one way the two differ. The server never sends a number as a string."""


@pytest.mark.parametrize(("model", "struct"), PAIRS, ids=lambda t: t.__name__)
def test_each_struct_has_the_protocol_types_fields_and_defaults(
    model: type[pydantic.BaseModel], struct: type[msgspec.Struct]
) -> None:
    expected = model_fields(model)
    got = struct_fields(struct)
    if struct is frames.Step:  # the history stays JSON until the Worker validates it
        assert expected.pop("history") == [] and got.pop("history") != "required"
    assert got == expected


def test_every_server_message_has_a_struct() -> None:
    union = typing.get_args(p.ServerMessage)[0]  # Annotated[Welcome | StepMessage | ..., Field]
    assert set(typing.get_args(union)) == {model for model, _ in PAIRS}


@pytest.mark.parametrize("message", VALID, ids=lambda m: f"{m['t']}")
def test_a_valid_message_reads_the_same_both_ways(message: dict[str, Any]) -> None:
    frame = orjson.dumps([message])
    (model,) = p.SERVER_FRAME.validate_json(frame)
    (struct,) = frames.decode(frame)
    expected = model.model_dump()
    got = {"t": message["t"], **msgspec.structs.asdict(struct)}
    if isinstance(struct, frames.Step):
        raw = got.pop("history")
        history = expected.pop("history")
        if raw is msgspec.UNSET:
            assert history == []
        else:
            assert ITEMS.validate_json(bytes(raw)) == ITEMS.validate_python(history)
    assert got == expected


@pytest.mark.parametrize("message", INVALID)
def test_what_the_protocol_refuses_the_worker_refuses(message: Any) -> None:
    refused_by_both(p.SERVER_FRAME, frames.decode, message)


@pytest.mark.parametrize("message", STRICTER)
def test_a_number_sent_as_a_string_is_refused(message: dict[str, Any]) -> None:
    coerced_by_pydantic_only(p.SERVER_FRAME, frames.decode, message)


def test_a_frame_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError):
        frames.decode(b'[{"t": "ack"')

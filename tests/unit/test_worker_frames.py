"""After the ``hello``, the server decodes the Workers' frames with msgspec structs
(``dex.wire.worker_frames``) that mirror the protocol's pydantic types (``WORKER_FRAME``,
from which the protocol's page is generated): they must have the same fields and defaults,
read valid frames the same way and refuse what the protocol refuses."""

from __future__ import annotations

import json
import typing
from typing import Any

import msgspec
import orjson
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex.wire import RecoveryError
from dex.wire import protocol as p
from dex.wire import worker_frames as frames
from tests.support.mirrors import (
    coerced_by_pydantic_only,
    model_fields,
    refused_by_both,
    struct_fields,
)

PAIRS: list[tuple[type[pydantic.BaseModel], type[msgspec.Struct]]] = [
    (p.Heartbeat, frames.Heartbeat),
    (p.Delta, frames.Delta),
    (p.Done, frames.Done),
    (p.Fail, frames.Fail),
    (p.Back, frames.Back),
    (p.Drain, frames.Drain),
    (RecoveryError, frames.RecoveryError),
]

AID = "s/1.1/1"
VALID: list[dict[str, Any]] = [
    {"t": "hb", "attempts": [AID, "s/1.2/1"], "seq": 3},
    {"t": "hb", "attempts": []},
    {"t": "hb", "attempts": [AID], "seq": None},
    {"t": "delta", "attempt_id": AID, "text": "hel"},
    {"t": "delta", "attempt_id": AID, "text": ""},
    {"t": "done", "attempt_id": AID, "result": {}},
    {
        "t": "done",
        "attempt_id": AID,
        "result": {"text": "", "tool_calls": [{"id": "c", "name": "t", "arguments": {"k": [1]}}]},
    },
    {"t": "fail", "attempt_id": AID, "error": {"message": "boom"}},
    {
        "t": "fail",
        "attempt_id": AID,
        "error": {"message": "x", "attempt_progress": "NOT_STARTED", "retryable": False},
    },
    {"t": "back", "attempt_id": AID},
    {"t": "back", "attempt_id": AID, "reason": "history"},
    {"t": "back", "attempt_id": AID, "reason": None},
    {"t": "drain"},
]
INVALID: list[Any] = [
    {"t": "bye"},  # no such message
    {"attempt_id": AID},  # no type
    {"t": "done", "attempt_id": AID},  # a required field missing
    {"t": "done", "attempt_id": AID, "result": {}, "extra": 1},  # an unknown field
    {"t": "done", "attempt_id": AID, "result": [1]},  # a result that is not an object
    {"t": "done", "attempt_id": AID, "result": "ok"},
    {"t": "done", "attempt_id": AID, "result": None},
    {"t": "done", "attempt_id": "", "result": {}},
    {"t": "done", "attempt_id": "x" * 513, "result": {}},
    {"t": "done", "attempt_id": 7, "result": {}},
    {"t": "hb", "attempts": AID},
    {"t": "hb", "attempts": [""]},
    {"t": "hb", "attempts": [], "seq": 1.5},
    {"t": "delta", "attempt_id": AID, "text": 3},
    {"t": "fail", "attempt_id": AID, "error": "boom"},
    {"t": "fail", "attempt_id": AID, "error": {}},
    {"t": "fail", "attempt_id": AID, "error": {"message": "x", "attempt_progress": "HALF"}},
    {"t": "fail", "attempt_id": AID, "error": {"message": "x", "why": "extra"}},
    {"t": "back", "attempt_id": AID, "reason": "tired"},
    {"t": "drain", "now": True},
    "done",
    [],
]
STRICTER: list[dict[str, Any]] = [
    {"t": "hb", "attempts": [], "seq": "3"},
    {"t": "hb", "attempts": [], "seq": False},
    {"t": "fail", "attempt_id": AID, "error": {"message": "x", "retryable": "false"}},
    {"t": "fail", "attempt_id": AID, "error": {"message": "x", "retryable": 0}},
]
"""What pydantic's lax mode coerces (a number or a boolean sent as a string, a boolean as
a number, 0 as false) and msgspec refuses: the one way the two differ. The protocol's
page says each field's JSON type is sent as it is, and the Python, TypeScript and Go
Workers send them so."""


@pytest.mark.parametrize(("model", "struct"), PAIRS, ids=lambda t: t.__name__)
def test_each_struct_has_the_protocol_types_fields_and_defaults(
    model: type[pydantic.BaseModel], struct: type[msgspec.Struct]
) -> None:
    assert struct_fields(struct) == model_fields(model)


def test_every_worker_message_has_a_struct() -> None:
    union = typing.get_args(p.WorkerMessage)[0]  # Annotated[Hello | Heartbeat | ..., Field]
    assert set(typing.get_args(union)) - {p.Hello} == {m for m, _ in PAIRS} - {RecoveryError}
    assert set(typing.get_args(frames.WorkerMessage)) - {frames.Hello} == {s for _, s in PAIRS} - {
        frames.RecoveryError
    }


def _plain(struct: Any) -> Any:
    """A decoded message as the protocol's model dumps it."""
    if isinstance(struct, msgspec.Raw):
        return orjson.loads(bytes(struct))
    if isinstance(struct, msgspec.Struct):
        tag = msgspec.inspect.type_info(type(struct)).tag  # type: ignore[attr-defined]
        fields = {k: _plain(v) for k, v in msgspec.structs.asdict(struct).items()}
        return {"t": tag, **fields} if tag is not None else fields
    return struct


@pytest.mark.parametrize("message", VALID, ids=lambda m: f"{m['t']}")
def test_a_valid_message_reads_the_same_both_ways(message: dict[str, Any]) -> None:
    frame = orjson.dumps([message])
    (model,) = p.WORKER_FRAME.validate_json(frame)
    (struct,) = frames.decode(frame)
    assert _plain(struct) == model.model_dump()


@pytest.mark.parametrize("message", INVALID)
def test_what_the_protocol_refuses_the_server_refuses(message: Any) -> None:
    refused_by_both(p.WORKER_FRAME, frames.decode, message)


@pytest.mark.parametrize("message", STRICTER)
def test_a_number_or_boolean_sent_as_a_string_is_refused(message: dict[str, Any]) -> None:
    coerced_by_pydantic_only(p.WORKER_FRAME, frames.decode, message)


def test_a_hello_after_the_first_frame_is_read_as_one_whatever_it_holds() -> None:
    hello = {"t": "hello", "worker_id": 7, "agents": "none"}
    assert frames.decode(orjson.dumps([hello])) == [frames.Hello()]


def test_a_frame_that_is_not_json_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        frames.decode(b'[{"t": "hb"')


texts = st.text(alphabet='abz é"\\', max_size=6)
"""No digits: a number sent as a string is one of ``STRICTER``'s cases, where the two are
known to differ (the fuzzing below sends none of them)."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner),
    max_leaves=6,
)
attempt_ids = st.one_of(st.just(AID), texts, st.integers(), st.none())
fuzzed = st.one_of(
    st.fixed_dictionaries(
        {"t": st.just("hb"), "attempts": st.lists(attempt_ids, max_size=2) | json_values},
        optional={"seq": st.integers(-(2**63), 2**64 - 1) | st.none() | texts | st.lists(texts)},
    ),
    st.fixed_dictionaries(
        {"t": st.just("delta"), "attempt_id": attempt_ids, "text": st.text() | json_values}
    ),
    st.fixed_dictionaries({"t": st.just("done"), "attempt_id": attempt_ids, "result": json_values}),
    st.fixed_dictionaries(
        {
            "t": st.just("fail"),
            "attempt_id": attempt_ids,
            "error": st.fixed_dictionaries(
                {"message": texts | json_values},
                optional={
                    "attempt_progress": st.sampled_from(["UNSPECIFIED", "NOT_STARTED", "x"]),
                    "retryable": st.booleans() | st.none(),
                },
            )
            | json_values,
        }
    ),
    st.fixed_dictionaries(
        {"t": st.just("back"), "attempt_id": attempt_ids},
        optional={"reason": st.sampled_from(["history", None, "other"])},
    ),
    st.fixed_dictionaries({"t": st.just("drain")}, optional={"x": json_values}),
    st.dictionaries(texts, json_values, max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(frame=st.lists(fuzzed, max_size=3))
def test_any_frame_is_accepted_by_both_or_refused_by_both(frame: list[Any]) -> None:
    raw = json.dumps(frame).encode()  # integers beyond 64 bits too: refused later, by both
    try:
        models = p.WORKER_FRAME.validate_json(raw)
    except pydantic.ValidationError:
        with pytest.raises(msgspec.ValidationError):
            frames.decode(raw)
        return
    assert [_plain(s) for s in frames.decode(raw)] == [m.model_dump() for m in models]

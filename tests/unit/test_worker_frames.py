"""The frames a Worker sends are msgspec structs (``dex.wire.worker_frames``), the
protocol's one definition: the Python Worker writes them, the server reads them. The
server reads what fits, refuses what does not (each field's JSON type as it is, the
limits), and reads back exactly what the Worker wrote."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex.wire import AgentSpec, AttemptProgress, ToolKind
from dex.wire import worker_frames as frames
from dex.wire.outbox import encode

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
"""What a lax reader would coerce (a number or a boolean sent as a string, a boolean as a
number, 0 as false): refused. The protocol's page says each field's JSON type is sent as
it is, and the Python, TypeScript and Go Workers send them so."""

HELLO = {"t": "hello", "worker_id": "w", "agents": []}
AGENT = {
    "name": "a",
    "model": {"provider": "scripted", "n": 2**64 - 1},
    "tools": [{"name": "t", "kind": "read", "approval": "predicate", "has_check": True}],
    "model_retry": {"max_attempts": 5, "within_seconds": 10},
    "compact_threshold_chars": 100,
}
HELLOS: list[dict[str, Any]] = [
    HELLO,
    {
        **HELLO,
        "agents": [AGENT],
        "capacity": 100_000,
        "attempts": [AID],
        "resume": "r",
        "history_cache": 1_000_000,
        "protocol": 1,
    },
    {**HELLO, "resume": None, "capacity": 1, "history_cache": 0},
]
BAD_HELLOS: list[list[Any]] = [
    [],
    [{"t": "hb", "attempts": []}, HELLO],  # a hello, not first
    [{"t": "hello", "agents": []}],
    [{**HELLO, "worker_id": ""}],
    [{**HELLO, "worker_id": "w" * 201}],
    [{**HELLO, "worker_id": 7}],
    [{**HELLO, "agents": 3}],
    [{**HELLO, "agents": [{"name": "a"}] * 1001}],
    [{**HELLO, "capacity": 0}],
    [{**HELLO, "capacity": 100_001}],
    [{**HELLO, "capacity": 1.5}],
    [{**HELLO, "history_cache": -1}],
    [{**HELLO, "history_cache": 1_000_001}],
    [{**HELLO, "resume": "r" * 201}],
    [{**HELLO, "attempts": [""]}],
    [{**HELLO, "surprise": True}],
    [{**HELLO, "agents": [{"name": ""}]}],
    [{**HELLO, "agents": [{"name": "a", "surprise": 1}]}],
    [{**HELLO, "agents": [{"name": "a", "tools": [{"name": "t", "kind": "reed"}]}]}],
    [{**HELLO, "agents": [{"name": "a", "compact_threshold_chars": 99}]}],
    [{**HELLO, "agents": [{"name": "a", "model_retry": {"max_attempts": 0}}]}],
    [HELLO, {"t": "done", "attempt_id": AID}],  # the rest of the frame counts too
    [HELLO, {"t": "done", "attempt_id": AID, "result": [1]}],
]
LAX_HELLOS: list[dict[str, Any]] = [
    {**HELLO, "capacity": "16"},
    {**HELLO, "history_cache": True},
    {**HELLO, "agents": [{"name": "a", "model_retry": {"max_attempts": "3"}}]},
    {**HELLO, "agents": [{"name": "a", "tools": [{"name": "t", "has_check": 1}]}]},
]
"""The ``hello`` is as strict as the rest, its agents too."""


def _plain(value: Any) -> Any:
    """A decoded message as JSON values, the fields it left out with their defaults."""
    if isinstance(value, msgspec.Raw):
        return orjson.loads(bytes(value))
    if isinstance(value, msgspec.Struct):
        tag = msgspec.inspect.type_info(type(value)).tag  # type: ignore[attr-defined]
        fields = {k: _plain(v) for k, v in msgspec.structs.asdict(value).items()}
        return {"t": tag, **fields} if tag is not None else fields
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, AgentSpec):
        return value.model_dump(mode="json")
    return value


def _holds(read: Any, sent: Any) -> bool:
    """Whether what was read holds every value sent (and, besides, defaults)."""
    if isinstance(sent, dict):
        return isinstance(read, dict) and all(
            k in read and _holds(read[k], v) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return isinstance(read, list) and len(read) == len(sent) and all(map(_holds, read, sent))
    return bool(read == sent and isinstance(read, bool) == isinstance(sent, bool))


@pytest.mark.parametrize("message", VALID, ids=lambda m: f"{m['t']}")
def test_a_valid_message_reads_as_it_was_sent(message: dict[str, Any]) -> None:
    (struct,) = frames.decode(orjson.dumps([message]))
    assert _holds(_plain(struct), message)


@pytest.mark.parametrize("message", VALID, ids=lambda m: f"{m['t']}")
def test_what_the_worker_writes_the_server_reads_back(message: dict[str, Any]) -> None:
    (struct,) = frames.decode(orjson.dumps([message]))
    assert _plain(frames.decode(encode([struct]))) == [_plain(struct)]


def test_what_a_message_leaves_out_reads_as_its_default() -> None:
    hb, fail, back = frames.decode(
        b'[{"t": "hb", "attempts": []}, {"t": "fail", "attempt_id": "a", "error":'
        b' {"message": "m"}}, {"t": "back", "attempt_id": "a"}]'
    )
    assert isinstance(hb, frames.Heartbeat) and hb.seq is None
    assert isinstance(fail, frames.Fail)
    assert fail.error.attempt_progress == AttemptProgress.UNSPECIFIED
    assert fail.error.retryable is True
    assert isinstance(back, frames.Back) and back.reason is None
    hello = frames.decode_hello(orjson.dumps([HELLO]))
    assert (hello.capacity, hello.attempts, hello.resume) == (16, [], None)
    assert (hello.history_cache, hello.protocol) == (0, 1)


@pytest.mark.parametrize("message", INVALID)
def test_what_the_protocol_refuses_the_server_refuses(message: Any) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode(orjson.dumps([message]))


@pytest.mark.parametrize("message", STRICTER)
def test_a_number_or_boolean_sent_as_a_string_is_refused(message: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode(orjson.dumps([message]))


@pytest.mark.parametrize("hello", HELLOS)
def test_a_hello_reads_as_it_was_sent_and_back(hello: dict[str, Any]) -> None:
    read = frames.decode_hello(orjson.dumps([hello, {"t": "drain"}]))
    assert _holds(_plain(read), hello)
    assert frames.decode_hello(encode([read])) == read


def test_a_hellos_agents_are_their_payload_type() -> None:
    hello = frames.decode_hello(orjson.dumps([{**HELLO, "agents": [AGENT]}]))
    (agent,) = hello.agents
    assert isinstance(agent, AgentSpec) and agent.tools[0].kind is ToolKind.READ


@pytest.mark.parametrize("frame", BAD_HELLOS)
def test_a_first_frame_that_does_not_fit_is_refused(frame: list[Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode_hello(orjson.dumps(frame))


@pytest.mark.parametrize("hello", LAX_HELLOS)
def test_a_hello_with_a_number_or_boolean_sent_otherwise_is_refused(
    hello: dict[str, Any],
) -> None:
    with pytest.raises(msgspec.ValidationError):
        frames.decode_hello(orjson.dumps([hello]))


def test_a_refused_hello_says_where() -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        frames.decode_hello(orjson.dumps([{**HELLO, "capacity": 0}]))
    assert str(refused.value) == "Expected `int` >= 1 - at `$[0].capacity`"
    bad_tool = {**HELLO, "agents": [{"name": "a", "tools": [{"name": "t", "kind": "reed"}]}]}
    with pytest.raises(msgspec.ValidationError) as refused:
        frames.decode_hello(orjson.dumps([bad_tool]))
    assert str(refused.value).startswith("tools.0.kind: Input should be 'read'")
    assert str(refused.value).endswith("- at `$[0].agents[0]`")
    with pytest.raises(msgspec.ValidationError, match="the first message must be a hello"):
        frames.decode_hello(b'[{"t": "drain"}]')


def test_a_hello_after_the_first_frame_is_read_as_one_whatever_it_holds() -> None:
    hello = {"t": "hello", "worker_id": 7, "agents": "none"}
    assert frames.decode(orjson.dumps([hello])) == [frames.HelloAgain()]


def test_a_frame_that_is_not_json_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        frames.decode(b'[{"t": "hb"')


texts = st.text(alphabet='abz é"\\0', max_size=6)
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
def test_any_frame_is_read_whole_or_refused_by_name(frame: list[Any]) -> None:
    """The server closes the connection on a ``ValidationError`` and names it: any other
    exception would escape its handler."""
    raw = json.dumps(frame).encode()
    try:
        messages = frames.decode(raw)
    except msgspec.ValidationError as e:
        assert " - at `$" in str(e)
        return
    assert _plain(frames.decode(encode(messages))) == _plain(messages)

"""Stored records: they carry a format version and tolerate fields they do not know (a newer
node wrote them during a rolling upgrade), while API and Worker input keeps refusing them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.state import SessionState, Turn
from dex.wire import ITEM, AgentSpec, ModelResponse, ModelToolCall
from tests.unit.test_store import SPEC, T0, in_a_turn


def with_unknown_fields(raw: str, *paths: tuple[Any, ...]) -> str:
    """``raw`` with a field ``future_<n>`` added at each path (keys and list indexes)."""
    data = orjson.loads(raw)
    for n, path in enumerate(paths):
        node = data
        for step in path:
            node = node[step]
        node[f"future_{n}"] = {"nested": [1, 2]}
    return orjson.dumps(data).decode()


def ended_turn() -> Turn:
    state = SessionState(id="s1", agent="helper", created_at=T0)
    t, _ = handlers.receive_message(state, SPEC, "hi", "m-1", T0)
    step = t.ready[0]
    handlers.assign(state, step.id, "w1", T0)
    response = ModelResponse(text="hello")
    done = handlers.complete_model(state, SPEC, step.id, 1, response, T0 + 1)
    assert done.ended_turn is not None
    return done.ended_turn


def test_records_carry_the_format_version() -> None:
    state, history = in_a_turn("s1")
    w = records.write(session=state, history=history, ended_turn=ended_turn(), agents=[SPEC])

    assert w.session is not None and w.ended_turn is not None
    assert orjson.loads(w.session.state)["format"] == records.FORMAT == 1
    assert orjson.loads(w.ended_turn.turn)["format"] == 1
    assert orjson.loads(w.agents[0][1])["format"] == 1
    assert records.session((w.session.state, w.history)) == (state, history)
    assert records.turn(w.ended_turn.turn) == ended_turn()
    assert records.agent(w.agents[0][1]) == SPEC


def test_a_record_without_a_format_is_read_as_format_1() -> None:
    state, history = in_a_turn("s1")

    loaded = records.session(
        (state.model_dump_json(), [ITEM.dump_json(i).decode() for i in history])
    )

    assert loaded == (state, history)


def test_unknown_fields_at_any_depth_are_dropped_not_refused() -> None:
    state, history = in_a_turn("s1")
    raw_state = with_unknown_fields(
        records.session_record(state).state,
        (),
        ("turn",),
        ("turn", "steps", 0),
        ("turn", "steps", 0, "retry"),
        ("turn", "steps", 1, "attempts", 0),
        ("turn", "tool_calls", 0),
    )
    raw_items = [
        with_unknown_fields(ITEM.dump_json(history[0]).decode(), ()),
        with_unknown_fields(ITEM.dump_json(history[1]).decode(), (), ("tool_calls", 0)),
    ]
    raw_spec = with_unknown_fields(
        records.write(agents=[SPEC]).agents[0][1], (), ("tools", 1), ("tools", 0, "retry")
    )

    assert records.session((raw_state, raw_items)) == (state, history)
    assert records.agent(raw_spec) == SPEC
    assert records.turn(with_unknown_fields(records.turn_record(ended_turn()).turn, ())) == (
        ended_turn()
    )


def test_a_stored_record_that_is_wrong_otherwise_is_still_refused() -> None:
    state, _ = in_a_turn("s1")
    data = orjson.loads(records.session_record(state).state)
    data["future"] = 1
    data["history_length"] = "many"

    with pytest.raises(ValidationError, match="history_length"):
        records.session((orjson.dumps(data).decode(), []))


def test_api_and_worker_input_still_refuses_unknown_fields() -> None:
    spec = SPEC.model_dump(mode="json")
    item: dict[str, Any] = {"type": "user", "text": "hi", "surprise": 1}
    call = {"id": "c1", "name": "lookup", "arguments": {}, "surprise": 1}

    with pytest.raises(ValidationError, match="surprise"):
        AgentSpec.model_validate({**spec, "surprise": 1})
    with pytest.raises(ValidationError, match="surprise"):
        ITEM.validate_python(item)
    with pytest.raises(ValidationError, match="surprise"):
        ModelToolCall.model_validate(call)
    with pytest.raises(ValidationError, match="surprise"):
        SessionState.model_validate({"id": "s", "agent": "a", "created_at": 1.0, "surprise": 1})


def test_a_value_that_cannot_be_encoded_is_invalid_input_not_a_crash() -> None:
    from dex.errors import InvalidInput
    from dex.server import records
    from dex.server.engine.state import SessionState
    from dex.wire import NoteItem

    state = SessionState(id="s", agent="a", created_at=0)
    with pytest.raises(InvalidInput, match="cannot be stored"):
        records.write(session=state, history=[NoteItem(text="\ud800")])  # a lone surrogate

"""Stored records: they carry a format version, a commit writes the Step and call rows that
changed (and what storage then holds is exactly the state in memory), they tolerate fields
they do not know (a newer node wrote them during a rolling upgrade), and API and Worker
input keeps refusing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dex.errors import CorruptRecord, DexError, InvalidInput
from dex.server import records
from dex.server.engine import handlers
from dex.server.engine.state import AttemptError, SessionState, Turn
from dex.server.store.base import StoredSession, StoredTurn, Write
from dex.wire import (
    ITEM,
    AgentSpec,
    AttemptProgress,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    StepStatus,
    ToolOutcome,
)
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


class Storage:
    """The rows a sequence of writes leaves, kept as a store keeps them."""

    def __init__(self) -> None:
        self.state = ""
        self.turn: int | None = None
        self.history: list[str] = []
        self.rows: dict[tuple[str, int, int], str] = {}
        self.turns: dict[int, str] = {}
        self.rows_written = 0

    def apply(self, w: Write) -> None:
        assert w.session is not None
        self.state, self.turn = w.session.state, w.session.turn
        self.history += w.history
        for kind, rows in (("s", w.steps), ("c", w.calls)):
            for r in rows:
                self.rows[(kind, r.turn, r.seq)] = r.json
        self.rows_written += len(w.steps) + len(w.calls)
        if w.ended_turn is not None:
            self.turns[w.ended_turn.number] = w.ended_turn.turn

    def _of(self, kind: str, turn: int | None) -> list[str]:
        found = sorted((k[2], v) for k, v in self.rows.items() if k[0] == kind and k[1] == turn)
        return [v for _, v in found]

    def session(self) -> tuple[SessionState, list[Item], records.Rows]:
        stored = StoredSession(
            self.state, self._of("s", self.turn), self._of("c", self.turn), self.history
        )
        return records.session(stored)

    def archived(self, number: int) -> Turn:
        stored = StoredTurn(self.turns[number], self._of("s", number), self._of("c", number))
        return records.turn(stored)


def test_records_carry_the_format_version() -> None:
    state, history = in_a_turn("s1")
    w = records.write(session=state, history=history, agents=[SPEC])
    idle = SessionState(id="s2", agent="helper", created_at=T0, messages_received=1)
    ended = records.write(session=idle, ended_turn=ended_turn())

    assert w.session is not None and ended.ended_turn is not None
    assert orjson.loads(w.session.state)["format"] == records.FORMAT == 2
    assert orjson.loads(ended.ended_turn.turn)["format"] == 2
    assert orjson.loads(w.agents[0][1])["format"] == 2
    assert records.agent(w.agents[0][1]) == SPEC
    storage = Storage()
    storage.apply(w)
    loaded, loaded_history, _ = storage.session()
    assert (loaded, loaded_history) == (state, history)
    other = Storage()
    other.apply(ended)
    assert other.archived(1) == ended_turn()
    assert other.session()[0] == idle


def test_the_state_record_leaves_steps_and_calls_to_their_rows() -> None:
    state, _ = in_a_turn("s1")
    w = records.write(session=state)

    assert w.session is not None and w.session.turn == 1
    stored = orjson.loads(w.session.state)
    assert stored["turn"]["steps"] == [] and stored["turn"]["tool_calls"] == []
    assert state.turn is not None and len(state.turn.steps) == 2  # the state itself is whole
    assert [(r.turn, r.seq) for r in w.steps] == [(1, 1), (1, 2)]
    assert [(r.turn, r.seq) for r in w.calls] == [(1, 1)]


def test_each_commit_writes_the_rows_that_changed_and_storage_stays_equal_to_memory() -> None:
    """A turn of two tool calls, a retry and a question, committed transition by
    transition: after each commit, what storage holds reads back as the state in memory,
    and a commit writes only the Steps and calls the transition changed."""
    state = SessionState(id="s1", agent="helper", created_at=T0)
    storage, rows = Storage(), records.Rows()
    now = T0
    before: dict[tuple[str, str], bytes] = {}

    def encoded(turn: Turn | None) -> dict[tuple[str, str], bytes]:
        if turn is None:
            return {}
        steps = {("s", s.id): msgspec.json.encode(s) for s in turn.steps}
        return steps | {("c", c.id): msgspec.json.encode(c) for c in turn.tool_calls}

    def commit(t: handlers.Transition | None = None) -> None:
        nonlocal before
        start = state.history_length
        items = t.history if t is not None else []
        state.history_length += len(items)
        ended = t.ended_turn if t is not None else None
        w = records.write(
            session=state, rows=rows, history=items, history_start=start, ended_turn=ended
        )
        now_encoded = encoded(ended) | encoded(state.turn)
        changed = {k for k, v in now_encoded.items() if before.get(k) != v}
        written = {("s", f"{r.turn}.{r.seq}") for r in w.steps}
        written |= {("c", f"{r.turn}.{r.seq}") for r in w.calls}
        assert written == changed  # the rows the transition changed, and only those
        before = encoded(state.turn)
        storage.apply(w)
        loaded, _, _ = storage.session()
        assert loaded == state
        if t is not None and t.ended_turn is not None:
            assert storage.archived(t.ended_turn.number) == t.ended_turn

    def run(step_id: str) -> int:
        nonlocal now
        now += 1
        attempt = handlers.assign(state, step_id, "w1", now)
        commit()
        return attempt.number

    storage.apply(records.write(session=state, create=True))
    t, _ = handlers.receive_message(state, SPEC, "go", None, now)
    commit(t)
    model = t.ready[0].id
    calls = [
        ModelToolCall(id="a", name="lookup", arguments={"n": 1}),
        ModelToolCall(id="b", name="lookup", arguments={"n": 2}),
    ]
    n = run(model)
    t = handlers.complete_model(state, SPEC, model, n, ModelResponse(tool_calls=calls), now)
    commit(t)
    first, second = (s.id for s in t.ready)
    n = run(first)
    failure = AttemptError(message="lost", attempt_progress=AttemptProgress.NOT_COMPLETED)
    commit(handlers.fail_attempt(state, SPEC, first, n, failure, now, backoff=False))
    n = run(first)
    commit(handlers.complete_tool(state, SPEC, first, n, ToolOutcome(status="succeeded"), now))
    n = run(second)
    asked = ToolOutcome(status="asked", question="sure?", choices=["yes", "no"])
    commit(handlers.complete_tool(state, SPEC, second, n, asked, now))
    assert state.turn is not None
    handlers.record_input(state, {"kind": "answer", "call_id": "1.2", "answer": "yes"}, now)
    commit()
    t = handlers.apply_input(state, SPEC, now)
    commit(t)
    again = t.ready[0].id
    n = run(again)
    t = handlers.complete_tool(state, SPEC, again, n, ToolOutcome(status="succeeded"), now)
    commit(t)
    last = t.ready[0].id
    n = run(last)
    t = handlers.complete_model(state, SPEC, last, n, ModelResponse(text="done"), now)
    commit(t)
    assert t.ended_turn is not None and state.turn is None


def test_a_record_of_format_1_is_read_with_its_steps_inline() -> None:
    """Dex 0.1 and 0.2 kept Steps and calls inside the state: such a record still loads,
    and its rows are all written on the next commit."""
    state, history = in_a_turn("s1")
    whole = msgspec.json.encode(state).decode()
    stored = StoredSession(
        '{"format":1,' + whole[1:], [], [], [ITEM.dump_json(i).decode() for i in history]
    )

    loaded, loaded_history, rows = records.session(stored)

    assert (loaded, loaded_history) == (state, history)
    w = records.write(session=loaded, rows=rows)
    assert len(w.steps) == 2 and len(w.calls) == 1
    assert records.session(StoredSession(whole, [], [], []))[0] == state  # no format: 1


def test_unknown_fields_at_any_depth_are_dropped_not_refused() -> None:
    state, history = in_a_turn("s1")
    w = records.write(session=state, history=history)
    assert w.session is not None
    raw_state = with_unknown_fields(w.session.state, (), ("turn",))
    raw_steps = [
        with_unknown_fields(w.steps[0].json, (), ("retry",)),
        with_unknown_fields(w.steps[1].json, ("attempts", 0)),
    ]
    raw_calls = [with_unknown_fields(w.calls[0].json, ())]
    raw_items = [
        with_unknown_fields(ITEM.dump_json(history[0]).decode(), ()),
        with_unknown_fields(ITEM.dump_json(history[1]).decode(), (), ("tool_calls", 0)),
    ]
    raw_spec = with_unknown_fields(
        records.write(agents=[SPEC]).agents[0][1], (), ("tools", 1), ("tools", 0, "retry")
    )

    loaded, loaded_history, _ = records.session(
        StoredSession(raw_state, raw_steps, raw_calls, raw_items)
    )
    assert (loaded, loaded_history) == (state, history)
    assert records.agent(raw_spec) == SPEC
    turn = records.turn_record(ended_turn()).turn
    assert records.turn(StoredTurn(with_unknown_fields(turn, ()), [], [])).text == "hello"


def test_a_stored_record_that_is_wrong_otherwise_is_still_refused() -> None:
    state, _ = in_a_turn("s1")
    w = records.write(session=state)
    assert w.session is not None
    data = orjson.loads(w.session.state)
    data["future"] = 1
    data["history_length"] = "many"

    with pytest.raises(CorruptRecord, match="history_length"):
        records.session(StoredSession(orjson.dumps(data).decode(), [], [], []))


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


def test_a_value_that_cannot_be_encoded_is_invalid_input_not_a_crash() -> None:
    state = SessionState(id="s", agent="a", created_at=0)
    with pytest.raises(InvalidInput, match="cannot be stored"):
        records.write(session=state, history=[NoteItem(text="\ud800")])  # a lone surrogate


# --- every record of every format version round-trips ------------------------------------------

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-format-1.json"


def test_every_row_stored_in_format_1_reads_writes_again_and_reads_back_the_same() -> None:
    """Each row Dex 0.1 stored (format 1, Steps inline) is read, written by this version
    (format 2, Steps as rows) and read back unchanged."""
    tables = json.loads(FIXTURE.read_text())["tables"]
    history: dict[str, list[str]] = {}
    for row in sorted(tables["history"], key=lambda r: (r["session_id"], r["seq"])):
        history.setdefault(row["session_id"], []).append(row["item"])
    assert tables["sessions"] and tables["turns"] and tables["agents"]
    for row in tables["sessions"]:
        stored = StoredSession(row["state"], [], [], history.get(row["id"], []))
        state, items, _ = records.session(stored, row["id"])
        storage = Storage()
        storage.apply(records.write(session=state, history=items))
        again, again_items, _ = storage.session()
        assert (again, again_items) == (state, items)
    for row in tables["turns"]:
        turn = records.turn(StoredTurn(row["turn"], [], []))
        idle = SessionState(id=row["session_id"], agent="helper", created_at=T0)
        storage = Storage()
        storage.apply(records.write(session=idle, ended_turn=turn))
        assert storage.archived(turn.number) == turn
    for row in tables["agents"]:
        spec = records.agent(row["spec"])
        assert records.agent(records.write(agents=[spec]).agents[0][1]) == spec


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["message", "assign", "done", "fail", "back", "recover"]),
        st.integers(0, 5),
    ),
    max_size=25,
)


@settings(max_examples=100, deadline=None)
@given(actions=ACTIONS)
def test_every_state_the_engine_reaches_round_trips(actions: list[tuple[str, int]]) -> None:
    """Sessions driven through random inputs (messages, hand-outs, results with tool calls,
    failures with each attempt_progress, hand-backs, a node's recovery), committed as the
    domain commits them: after each, storage reads back the state, history and ended turn."""
    state = SessionState(id="s1", agent="helper", created_at=T0)
    storage, rows = Storage(), records.Rows()
    storage.apply(records.write(session=state, create=True))
    history: list[Item] = []
    now = T0
    for action, choice in actions:
        now += 1
        try:
            t = _act(state, action, choice, now)
        except DexError:
            continue  # an input the state refuses: nothing changed
        start = state.history_length
        state.history_length += len(t.history)
        storage.apply(
            records.write(
                session=state,
                rows=rows,
                history=t.history,
                history_start=start,
                ended_turn=t.ended_turn,
            )
        )
        history += t.history
        loaded, loaded_history, _ = storage.session()
        assert (loaded, loaded_history) == (state, history)
        if t.ended_turn is not None:
            assert storage.archived(t.ended_turn.number) == t.ended_turn


def _act(state: SessionState, action: str, choice: int, now: float) -> handlers.Transition:
    if action == "message":
        return handlers.receive_message(state, SPEC, f"message {choice}", None, now)[0]
    if action == "recover":
        return handlers.recover(state, SPEC, now, "the node restarted")
    steps = [s for s in (state.turn.steps if state.turn else []) if s.type.value != "AwaitTimer"]
    step = steps[choice % len(steps)] if steps else None
    if step is None:
        return handlers.Transition()
    if action == "assign":
        if step.status == StepStatus.QUEUED:
            handlers.assign(state, step.id, "w1", now)
        return handlers.Transition()
    if step.status != StepStatus.RUNNING:
        return handlers.Transition()
    number = step.attempts[-1].number
    if action == "back":
        return handlers.hand_back(state, step.id, number)
    if action == "fail":
        progress = list(AttemptProgress)[choice % len(AttemptProgress)]
        error = AttemptError(message="boom", attempt_progress=progress)
        return handlers.fail_attempt(state, SPEC, step.id, number, error, now)
    if step.type.value == "RunModel":
        names = ["lookup", "charge"][: choice % 3]
        calls = [ModelToolCall(id=f"c{i}", name=n, arguments={"n": i}) for i, n in enumerate(names)]
        response = ModelResponse(text="" if calls else f"answer {choice}", tool_calls=calls)
        return handlers.complete_model(state, SPEC, step.id, number, response, now)
    outcome = ToolOutcome(status="succeeded", result={"value": choice})
    return handlers.complete_tool(state, SPEC, step.id, number, outcome, now)


# --- a corrupt row -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", ["not json", "[1, 2]", '{"format": 2, "id": 5}', "{", '"a string"', "null"]
)
def test_a_corrupt_state_is_a_corrupt_record_error_naming_the_session(raw: str) -> None:
    with pytest.raises(CorruptRecord, match=r"the stored state of session 's1' cannot be read"):
        records.session(StoredSession(raw, [], [], []), "s1")


def test_a_corrupt_history_item_step_row_turn_or_agent_is_a_corrupt_record_error() -> None:
    state, history = in_a_turn("s1")
    storage = Storage()
    storage.apply(records.write(session=state, history=history))
    good = StoredSession(storage.state, storage._of("s", 1), storage._of("c", 1), storage.history)
    bad_item = StoredSession(good.state, good.steps, good.calls, [*good.history, '{"type": 1}'])
    with pytest.raises(CorruptRecord, match=r"the stored history of session 's1'"):
        records.session(bad_item, "s1")
    bad_step = StoredSession(good.state, ['{"id": 7}'], good.calls, good.history)
    with pytest.raises(CorruptRecord, match=r"the stored state of session 's1'"):
        records.session(bad_step, "s1")
    with pytest.raises(CorruptRecord, match=r"a stored turn of session 's1' cannot be read"):
        records.turn(StoredTurn('{"number": "one"}', [], []), "s1")
    with pytest.raises(CorruptRecord, match="a stored agent cannot be read"):
        records.agent("\x00")


def test_a_new_sessions_write_is_the_general_write_of_it() -> None:
    state = SessionState(id="s1", agent="a", created_at=T0, updated_at=T0)
    new = records.new_session(state)
    assert new == records.write(session=state, create=True)
    assert new.session is not None and (new.session.status, new.session.turn) == ("idle", None)
    assert new.size() == len(new.session.state)

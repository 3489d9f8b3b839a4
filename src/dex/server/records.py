"""How the domain's durable records become the store's JSON text, and back.

The store keeps JSON it does not interpret. A session state, an archived turn and an
agent spec carry ``"format": FORMAT`` (a record without it is format 1, as Dex 0.1 wrote
it); a session's history items, Steps and tool calls follow their session's format.

Format 2 keeps each Step and tool call of a turn in a row of its own, and the state and
the archived turn without them: a transition writes the rows it changed (``Rows``
remembers what this node last wrote), so a commit's size follows the change, not the
turn or the conversation. Format 1 held them inside the state and the turn record; it
still reads, and a session loaded from it writes all its rows on its next commit.

Reading is tolerant: a field this version does not know (a newer node wrote it during a
rolling upgrade) is dropped, not refused, at any depth. Input from the API and from
Workers keeps refusing unknown fields (``dex.wire.Wire``); only stored records are read
this way. The engine's records are msgspec structs, encoded and decoded by msgspec; the
wire's (history items, agent specs) are pydantic models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from dex.errors import CorruptRecord, InvalidInput
from dex.server.engine.state import SessionState, Step, ToolCall, Turn
from dex.server.store.base import (
    RememberedMessage,
    Row,
    SessionRecord,
    StoredSession,
    StoredTurn,
    TurnRecord,
    Write,
)
from dex.wire import ITEM, ITEMS, AgentSpec, Item

FORMAT = 2
"""The format this version writes. Bump it when a stored record changes shape in a way
that an older reader cannot take by ignoring fields."""

_PREFIX = f'{{"format":{FORMAT},'.encode()
_WIRE_PREFIX = f'{{"format":{FORMAT},'
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_encode = msgspec.json.Encoder().encode
_STATE = msgspec.json.Decoder(SessionState)
_TURN = msgspec.json.Decoder(Turn)
_STEP = msgspec.json.Decoder(Step)
_CALL = msgspec.json.Decoder(ToolCall)
_NONE: list[Any] = []


@dataclass(eq=False)
class Rows:
    """What storage holds of the current turn's Steps and tool calls, as this node last
    wrote or read them: a commit writes a row only if its JSON changed. A Step or call that
    is final (it can change no more) is not encoded again. The memory of one session's
    actor: dropped with it when a commit fails."""

    turn: int | None = None
    written: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """(kind, id) -> JSON as stored, of the rows that may still change."""
    done: dict[str, int] = field(default_factory=lambda: {"s": 0, "c": 0})
    """Per kind, how many leading rows of the turn are final and stored."""
    final: set[tuple[str, str]] = field(default_factory=set)
    """Final and stored rows past ``done``."""

    def reset(self, turn: int | None) -> None:
        self.turn = turn
        self.written.clear()
        self.final.clear()
        self.done = {"s": 0, "c": 0}

    def remember(self, kind: str, items: Sequence[Step | ToolCall], texts: list[str]) -> None:
        """Rows just read from storage: they are stored as they are."""
        leading = True
        for i, (item, text) in enumerate(zip(items, texts, strict=True)):
            if not item.final:
                self.written[(kind, item.id)] = text.encode()
                leading = False
            elif leading:
                self.done[kind] = i + 1
            else:
                self.final.add((kind, item.id))

    def changed(self, turn: Turn, into_steps: list[Row], into_calls: list[Row]) -> None:
        """Append the rows of ``turn`` that storage does not hold as they are now."""
        if turn.number != self.turn:
            self.reset(turn.number)
        self._changed("s", turn.number, turn.steps, into_steps)
        self._changed("c", turn.number, turn.tool_calls, into_calls)

    def _changed(
        self, kind: str, number: int, items: Sequence[Step | ToolCall], into: list[Row]
    ) -> None:
        start = self.done[kind]
        leading = True
        for i in range(start, len(items)):
            item = items[i]
            key = (kind, item.id)
            if key in self.final:
                if leading:
                    self.done[kind] = i + 1
                    self.final.discard(key)
                continue
            raw = _encode(item)
            if self.written.get(key) != raw:
                into.append(Row(number, i + 1, raw.decode()))
            if item.final:
                self.written.pop(key, None)
                if leading:
                    self.done[kind] = i + 1
                else:
                    self.final.add(key)
            else:
                self.written[key] = raw
                leading = False


def write(
    *,
    session: SessionState | None = None,
    rows: Rows | None = None,
    create: bool = False,
    history: Sequence[Item] | None = None,
    history_plain: Sequence[dict[str, Any]] | None = None,
    history_start: int = 0,
    ended_turn: Turn | None = None,
    message: RememberedMessage | None = None,
    agents: list[AgentSpec] | None = None,
    archived_call: tuple[int, ToolCall] | None = None,
    archived_turns: list[Turn] | None = None,
) -> Write:
    """A store ``Write`` from domain objects: the session's state, the rows of the ended
    and the current turn that changed (``rows``: what storage holds; None writes them
    all), history items (``history_plain``: the same as ``plain_history`` gave them, to
    encode without dumping them again), an archived turn's changed call, archived turns to
    insert (a fork's). A value that cannot be stored
    (it cannot be encoded as JSON) is an ``InvalidInput``: nothing is written."""
    try:
        steps: list[Row] = []
        calls: list[Row] = []
        memory = rows if rows is not None else Rows()
        if ended_turn is not None:
            memory.changed(ended_turn, steps, calls)
        if session is not None and session.turn is not None:
            memory.changed(session.turn, steps, calls)
        if archived_call is not None:
            number, call = archived_call
            calls.append(Row(number, _seq(call.id), _encode(call).decode()))
        for archived in archived_turns or ():  # a fork's copies: every row
            Rows().changed(archived, steps, calls)
        return Write(
            session=session_record(session, memory) if session is not None else None,
            create=create,
            history=_history_json(history or (), history_plain),
            history_start=history_start,
            steps=steps,
            calls=calls,
            ended_turn=turn_record(ended_turn) if ended_turn is not None else None,
            archived_turns=[turn_record(t) for t in archived_turns or ()],
            message=message,
            agents=[(spec.name, _dump(spec)) for spec in agents or ()],
        )
    except (PydanticSerializationError, TypeError, ValueError, msgspec.EncodeError) as e:
        raise InvalidInput(f"this cannot be stored: {e}") from None


def plain_history(items: Sequence[Item]) -> list[dict[str, Any]]:
    """History items as plain JSON values (what hand-outs, streams and views carry); an
    ``InvalidInput`` for one that cannot be encoded."""
    try:
        return [item.model_dump(mode="json") for item in items]
    except (PydanticSerializationError, TypeError, ValueError) as e:
        raise InvalidInput(f"this cannot be stored: {e}") from None


def _history_json(items: Sequence[Item], plain: Sequence[dict[str, Any]] | None) -> list[str]:
    """Each item's stored JSON: from its plain value when there is one (orjson: one
    serialization by pydantic per item, not two), else, and for an integer orjson cannot
    encode (beyond 64 bits), pydantic's."""
    if plain is None:
        return [ITEM.dump_json(item).decode() for item in items]
    encoded = []
    for item, value in zip(items, plain, strict=True):
        try:
            encoded.append(orjson.dumps(value).decode())
        except orjson.JSONEncodeError:
            encoded.append(ITEM.dump_json(item).decode())
    return encoded


def new_session(state: SessionState) -> Write:
    """The write of a session just made, with no turn yet: its row alone, as ``write``
    gives it, without ``write``'s work for turns, history and agents (measured with
    callgrind: about 37,000 instructions against 50,000, on every creation)."""
    assert state.turn is None, "a new session has no turn"
    try:
        return Write(session=session_record(state), create=True)
    except (TypeError, ValueError, msgspec.EncodeError) as e:
        raise InvalidInput(f"this cannot be stored: {e}") from None


def _seq(item_id: str) -> int:
    """A Step's or call's place in its turn, from its id ``{turn}.{n}``."""
    return int(item_id.rpartition(".")[2])


def session_record(state: SessionState, rows: Rows | None = None) -> SessionRecord:
    """The state as JSON, with the columns the session list filters on: what the API
    shows as its status, since when it waits for a person, its unknown outcomes. Those
    look at the current turn's Steps and calls that may still change (``rows`` knows
    which), so they cost what the change costs, not what the turn holds."""
    turn = state.turn
    steps = calls = 0
    if rows is not None and turn is not None and rows.turn == turn.number:
        steps, calls = rows.done["s"], rows.done["c"]
    waits = state.person_waits(steps)
    return SessionRecord(
        state.id,
        state.agent,
        state.created_at,
        state.fleet_status(waits).value,
        _bare(state, turn),
        turn.number if turn is not None else None,
        updated_at=state.updated_at or state.created_at,
        waiting_since=state.waiting_since(waits),
        outcome_unknown=state.outcome_unknown(calls),
        tenant=state.tenant,
        usage=(state.usage.input_tokens, state.usage.output_tokens, state.usage.cost_usd),
    )


def turn_record(turn: Turn) -> TurnRecord:
    return TurnRecord(turn.number, turn.status.value, _bare(turn, turn))


def _bare(record: SessionState | Turn, turn: Turn | None) -> str:
    """``record`` as format-2 JSON, without ``turn``'s Steps and calls (rows of their own)."""
    if turn is None:
        return (_PREFIX + _encode(record)[1:]).decode()
    steps, calls = turn.steps, turn.tool_calls
    turn.steps, turn.tool_calls = _NONE, _NONE
    try:
        return (_PREFIX + _encode(record)[1:]).decode()
    finally:
        turn.steps, turn.tool_calls = steps, calls


def session(
    stored: StoredSession, session_id: str | None = None
) -> tuple[SessionState, list[Item], Rows]:
    """The state (with its current turn's Steps and calls), the history, and what storage
    holds of the turn's rows; ``CorruptRecord`` naming the session if any cannot be read."""
    name = f"session {session_id!r}" if session_id is not None else "a session"
    with _reading(f"the stored state of {name}"):
        state = _decode(_STATE, stored.state)
        rows = Rows()
        if state.turn is not None and _format(stored.state) >= 2:
            _attach(state.turn, stored.steps, stored.calls)
            rows.turn = state.turn.number
            rows.remember("s", state.turn.steps, stored.steps)
            rows.remember("c", state.turn.tool_calls, stored.calls)
    with _reading(f"the stored history of {name}"):
        return state, history(stored.history), rows


def turn(stored: StoredTurn, session_id: str | None = None) -> Turn:
    name = f" of session {session_id!r}" if session_id is not None else ""
    with _reading(f"a stored turn{name}"):
        record = _decode(_TURN, stored.turn)
        if _format(stored.turn) >= 2:
            _attach(record, stored.steps, stored.calls)
            return record
        for text in stored.calls:  # a format-1 turn's call changed since (reconciled): a row
            call = _decode(_CALL, text)
            seq = _seq(call.id)
            if 0 < seq <= len(record.tool_calls):
                record.tool_calls[seq - 1] = call
        return record


def maybe_turn(stored: StoredTurn | None, session_id: str | None = None) -> Turn | None:
    return None if stored is None else turn(stored, session_id)


@contextmanager
def _reading(what: str) -> Iterator[None]:
    """Any failure to decode a stored record is ``CorruptRecord``: ``what`` and the first
    problem, never a traceback for the caller."""
    try:
        yield
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CorruptRecord(f"{what} cannot be read: {where}: {first['msg']}") from e
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # not JSON, not an object
        raise CorruptRecord(f"{what} cannot be read: {e}") from e


def _attach(turn: Turn, steps: list[str], calls: list[str]) -> None:
    turn.steps = [_decode(_STEP, s) for s in steps]
    turn.tool_calls = [_decode(_CALL, c) for c in calls]


def _decode(decoder: msgspec.json.Decoder[T], text: str) -> T:
    try:
        return decoder.decode(text)
    except msgspec.DecodeError as e:
        raise ValueError(f"stored record: {e}") from None


def _format(text: str) -> int:
    """The format a stored record says it has (1 if it says none)."""
    if not text.startswith('{"format":'):
        return 1
    end = text.find(",", 10)
    try:
        return int(text[10:end])
    except ValueError:
        return 1


# --- wire records (pydantic): history items, agent specs ------------------------------


def _dump(model: BaseModel) -> str:
    return _WIRE_PREFIX + model.model_dump_json()[1:]


def history(items: list[str]) -> list[Item]:
    text = "[" + ",".join(items) + "]"
    try:
        return ITEMS.validate_json(text)
    except ValidationError:
        return _tolerant(ITEMS.validate_python, orjson.loads(text))


def agent(raw: str) -> AgentSpec:
    with _reading("a stored agent"):
        return _agent(raw)


def _agent(raw: str) -> AgentSpec:
    return _model(AgentSpec, raw)


def _model(cls: type[M], raw: str) -> M:
    data = orjson.loads(raw)
    data.pop("format", None)
    return _tolerant(cls.model_validate, data)


def _tolerant(validate: Callable[[Any], T], data: Any) -> T:
    """Validate stored data, dropping the fields this version does not know."""
    for _ in range(100):
        try:
            return validate(data)
        except ValidationError as e:
            errors = e.errors()
            if any(err["type"] != "extra_forbidden" for err in errors):
                raise
            for err in errors:
                _drop(data, err["loc"])
    raise ValueError("stored record: too many unknown fields")


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    """Delete the field at a validation error's ``loc``. A step that is not a key is a
    union's tag (a history item's ``type``): it names the branch, not a level."""
    node = data
    for step in loc[:-1]:
        in_list = isinstance(node, list) and isinstance(step, int)
        if in_list or (isinstance(node, dict) and step in node):
            node = node[step]
    if isinstance(node, dict):
        node.pop(loc[-1], None)

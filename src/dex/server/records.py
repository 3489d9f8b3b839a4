"""How the domain's durable records become the store's JSON text, and back.

The store keeps JSON it does not interpret. Each session state, archived turn and agent
spec carries ``"format": FORMAT`` (a record without it is format 1, as Dex 0.1 wrote
it); a session's history items follow their session's format. Reading is tolerant: a
field this version does not know (a newer node wrote it during a rolling upgrade) is
dropped, not refused, at any depth. Input from the API and from Workers keeps refusing
unknown fields (``dex.wire.Wire``); only stored records are read this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from dex.errors import InvalidInput
from dex.server.engine.state import SessionState, Turn
from dex.server.store.base import SessionRecord, TurnRecord, Write
from dex.wire import ITEM, ITEMS, AgentSpec, Item

FORMAT = 1
"""The format this version writes. Bump it when a stored record changes shape in a way
that an older reader cannot take by ignoring fields."""

_PREFIX = f'{{"format":{FORMAT},'
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def _dump(model: BaseModel) -> str:
    return _PREFIX + model.model_dump_json()[1:]


def write(
    *,
    session: SessionState | None = None,
    create: bool = False,
    history: list[Item] | None = None,
    history_start: int = 0,
    ended_turn: Turn | None = None,
    updated_turn: Turn | None = None,
    message: tuple[str, int] | None = None,
    agents: list[AgentSpec] | None = None,
) -> Write:
    """A store ``Write`` from domain objects. A value that cannot be stored (it cannot be
    encoded as JSON) is an ``InvalidInput``: nothing is written."""
    try:
        return _write(
            session, create, history, history_start, ended_turn, updated_turn, message, agents
        )
    except (PydanticSerializationError, TypeError, ValueError) as e:
        raise InvalidInput(f"this cannot be stored: {e}") from None


def _write(
    session: SessionState | None,
    create: bool,
    history: list[Item] | None,
    history_start: int,
    ended_turn: Turn | None,
    updated_turn: Turn | None,
    message: tuple[str, int] | None,
    agents: list[AgentSpec] | None,
) -> Write:
    return Write(
        session=session_record(session) if session is not None else None,
        create=create,
        history=[ITEM.dump_json(item).decode() for item in history or ()],
        history_start=history_start,
        ended_turn=turn_record(ended_turn) if ended_turn is not None else None,
        updated_turn=turn_record(updated_turn) if updated_turn is not None else None,
        message=message,
        agents=[(spec.name, _dump(spec)) for spec in agents or ()],
    )


def session_record(state: SessionState) -> SessionRecord:
    return SessionRecord(state.id, state.agent, state.created_at, state.status.value, _dump(state))


def turn_record(turn: Turn) -> TurnRecord:
    return TurnRecord(turn.number, turn.status.value, _dump(turn))


def session(raw: tuple[str, list[str]]) -> tuple[SessionState, list[Item]]:
    state, items = raw
    return _model(SessionState, state), history(items)


def history(items: list[str]) -> list[Item]:
    text = "[" + ",".join(items) + "]"
    try:
        return ITEMS.validate_json(text)
    except ValidationError:
        return _tolerant(ITEMS.validate_python, orjson.loads(text))


def turn(raw: str) -> Turn:
    return _model(Turn, raw)


def maybe_turn(raw: str | None) -> Turn | None:
    return None if raw is None else turn(raw)


def agent(raw: str) -> AgentSpec:
    return _model(AgentSpec, raw)


def _model(cls: type[M], raw: str) -> M:
    # The common case, straight from JSON text: a record of this format with no field this
    # version does not know (about half the cost of decoding to dicts and validating them).
    body = "{" + raw[len(_PREFIX) :] if raw.startswith(_PREFIX) else raw
    try:
        return cls.model_validate_json(body)
    except ValidationError:
        pass
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

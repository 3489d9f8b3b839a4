"""The fleet columns a commit writes (status, waiting since, unknown outcomes), and the
cursors of the fleet's lists: pure, without a store."""

from __future__ import annotations

import json

import pytest

from dex.errors import InvalidInput
from dex.server import records, views
from dex.server.engine import handlers
from dex.server.engine.state import AttemptError, SessionState, ToolCall, Turn, TurnStatus
from dex.server.fleet import INBOX, decode_cursor, encode_cursor
from dex.server.store.base import StoredTurn
from dex.wire import (
    AgentSpec,
    Approval,
    AttemptProgress,
    ModelResponse,
    ModelToolCall,
    ToolCallStatus,
    ToolKind,
    ToolOutcome,
    ToolSpec,
)

SPEC = AgentSpec(
    name="helper",
    tools=[
        ToolSpec(name="lookup", kind=ToolKind.READ),
        ToolSpec(name="book", kind=ToolKind.WRITE),
        ToolSpec(name="charge", kind=ToolKind.WRITE, approval=Approval.ALWAYS),
    ],
)


def test_each_commit_writes_the_columns_the_whole_state_shows() -> None:
    """A commit looks only at the Steps and calls that may still change; what it writes is
    what a look at the whole state says, at every step of a turn."""
    state = SessionState(id="s1", agent="helper", created_at=1.0)
    memory = records.Rows()
    written: list[tuple[str, float | None, int]] = []

    def commit(now: float) -> None:
        state.updated_at = now
        record = records.write(session=state, rows=memory).session
        assert record is not None
        whole = views.session_row(state)
        assert (record.status, record.waiting_since, record.outcome_unknown) == (
            whole["status"],
            whole["waiting_since"],
            whole["outcome_unknown"],
        )
        written.append((record.status, record.waiting_since, record.outcome_unknown))

    t, _ = handlers.receive_message(state, SPEC, "go", None, 2.0)
    handlers.assign(state, t.ready[0].id, "w1", 2.0)
    commit(2.0)
    calls = [
        ModelToolCall(id="c1", name="lookup", arguments={}),
        ModelToolCall(id="c2", name="book", arguments={}),
        ModelToolCall(id="c3", name="charge", arguments={"amount": 5}),
    ]
    t = handlers.complete_model(state, SPEC, "1.1", 1, ModelResponse(tool_calls=calls), 3.0)
    commit(3.0)
    lookup, book = (step.id for step in t.ready)
    handlers.assign(state, lookup, "w1", 4.0)
    handlers.complete_tool(state, SPEC, lookup, 1, ToolOutcome(status="succeeded"), 4.0)
    commit(4.0)
    handlers.assign(state, book, "w1", 5.0)
    lost = AttemptError(message="gone", attempt_progress=AttemptProgress.NOT_COMPLETED)
    handlers.fail_attempt(state, SPEC, book, 1, lost, 5.0)
    commit(5.0)
    assert memory.done["s"] >= 2  # later commits skip the Steps that ended
    handlers.record_input(state, {"kind": "approve", "call_id": "1.3"}, 6.0)
    commit(6.0)

    assert written == [
        ("running", None, 0),
        ("waiting", 3.0, 0),
        ("waiting", 3.0, 0),
        ("waiting", 3.0, 1),  # book's outcome is unknown
        ("running", None, 1),  # the approval is recorded: nobody needs to act
    ]


def test_a_cursor_reads_back_only_in_its_own_list() -> None:
    cursor = encode_cursor("created", 1.5, "s_1")

    assert decode_cursor("created", cursor) == (1.5, "s_1")
    with pytest.raises(InvalidInput, match="order=created"):
        decode_cursor("updated", cursor)
    with pytest.raises(InvalidInput, match="inbox"):
        decode_cursor("created", encode_cursor(INBOX, 1.5, "s_1"))
    for bad in ("", "!!", "bnVsbA", encode_cursor("created", 1.0, "x")[:-3]):
        with pytest.raises(InvalidInput, match="not one this server gave out"):
            decode_cursor("created", bad)


def test_a_reconciled_call_of_a_format_1_turn_reads_back_reconciled() -> None:
    """A turn archived by format 1 holds its calls inside its record; a call reconciled
    later is stored as a row of its own, and reading the turn takes the row."""
    call = ToolCall(
        id="1.1",
        model_call_id="c1",
        name="book",
        arguments={},
        kind=None,
        idempotency_key="s1/1.1",
        status=ToolCallStatus.OUTCOME_UNKNOWN,
    )
    turn = Turn(number=1, status=TurnStatus.COMPLETED, started_at=1.0, tool_calls=[call])
    format_1 = json.dumps(views.plain(turn))
    state = SessionState(id="s1", agent="helper", created_at=1.0, unknown_ended=1)
    handlers.reconcile_call(state, call, True, "succeeded", "booked", None, "ops", 2.0)
    [row] = records.write(session=state, archived_call=(1, call)).calls

    read = records.turn(StoredTurn(format_1, [], [row.json]))

    assert read.tool_calls[0].status == ToolCallStatus.SUCCEEDED
    assert read.tool_calls[0].result == "booked"
    assert state.outcome_unknown() == 0

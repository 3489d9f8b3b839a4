"""The pure fork: which history, summary and turns a fork at a turn keeps."""

from __future__ import annotations

import copy

import pytest

from dex.errors import Conflict
from dex.server.engine.budget import Budget, Usage
from dex.server.engine.fork import fork
from dex.server.engine.state import SessionState, SessionStatus, Turn, TurnStatus
from dex.wire import AssistantItem, Item, SummaryItem, UserItem


def compacted_session() -> tuple[SessionState, list[Item], list[Turn]]:
    """Three turns; turn 2 compacted turn 1 into a summary before answering."""
    history: list[Item] = [
        UserItem(text="one"),
        AssistantItem(text="answer one"),
        UserItem(text="two"),  # 2: turn 2 starts
        SummaryItem(text="they said one"),  # 3: made in turn 2
        AssistantItem(text="answer two"),
        UserItem(text="three"),  # 5: turn 3 starts
        AssistantItem(text="answer three"),
    ]
    turns = [
        Turn(number=n, history_start=start, status=TurnStatus.COMPLETED, started_at=0.0)
        for n, start in ((1, 0), (2, 2), (3, 5))
    ]
    state = SessionState(
        id="s",
        agent="a",
        created_at=0.0,
        messages_received=3,
        history_length=len(history),
        context_start=2,
        summary_at=3,
    )
    return state, history, turns


def test_a_fork_after_a_compaction_keeps_the_summary_the_model_saw_then() -> None:
    state, history, turns = compacted_session()
    forked, kept, archived = fork(state, history, turns, 3, "f", now=5.0)
    assert [getattr(item, "text", None) for item in forked.context(kept)] == [
        "they said one",
        "two",
        "answer two",
    ]
    assert (forked.context_start, forked.summary_at, forked.history_length) == (2, 3, 5)
    assert forked.context_chars == len("they said one") + len("two") + len("answer two")
    assert [t.number for t in archived] == [1, 2] and forked.messages_received == 2


def test_a_fork_before_the_compaction_has_no_summary() -> None:
    state, history, turns = compacted_session()
    forked, kept, _ = fork(state, history, turns, 2, "f", now=5.0)
    assert forked.summary_at is None and forked.context_start == 0
    assert [getattr(item, "text", None) for item in forked.context(kept)] == ["one", "answer one"]


def test_the_original_is_left_as_it_was() -> None:
    state, history, turns = compacted_session()
    copies = copy.deepcopy((state, history, turns))
    fork(state, history, turns, 2, "f", now=5.0)
    assert (state, history, turns) == copies


def test_a_session_in_a_turn_cannot_be_forked() -> None:
    state, history, turns = compacted_session()
    state.status = SessionStatus.RUNNING
    with pytest.raises(Conflict, match="in a turn"):
        fork(state, history, turns, 1, "f", now=5.0)


def test_a_fork_keeps_its_sessions_tenant() -> None:
    state, history, turns = compacted_session()
    state.tenant = "acme"
    forked, _, _ = fork(state, history, turns, 2, "f", now=5.0)
    assert forked.tenant == "acme"


def test_a_fork_keeps_the_budget_and_counts_its_own_usage() -> None:
    state, history, turns = compacted_session()
    state.budget = Budget(max_tokens=5_000)
    state.usage.add(4_000, 500, 0.02)
    forked, _, _ = fork(state, history, turns, 3, "f", now=5.0)
    assert forked.budget == Budget(max_tokens=5_000)
    assert forked.usage == Usage()  # the original's calls are the original's

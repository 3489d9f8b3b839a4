"""Forking a session at a turn: a new session whose history is the original's before it.

``before`` is the first turn the fork does not have: the fork keeps the history up to
(not including) that turn's user message, and its next message is its turn ``before``.
So "fork at turn 3" means "turn 3 again, differently", as a DBOS fork re-runs from a
step and a LangGraph fork resumes from the checkpoint before a node. ``before`` may be
one past the last turn: the fork then has the whole history.

Pure: no I/O, no clock; the original is only read.
"""

from __future__ import annotations

from dex.errors import Conflict, NotFound
from dex.server.engine.state import ForkedFrom, SessionState, SessionStatus, Turn
from dex.server.engine.transition import item_size
from dex.wire import Item, SummaryItem


def fork(
    state: SessionState,
    history: list[Item],
    ended: list[Turn],
    before: int,
    new_id: str,
    now: float,
) -> tuple[SessionState, list[Item], list[Turn]]:
    """(the new session's state, its history, its archived turns), from the original's
    state, history and ended turns."""
    if state.status != SessionStatus.IDLE or state.queued:
        raise Conflict(
            f"session {state.id} is in a turn: fork it once the turn has ended (or cancel it)",
            session_id=state.id,
        )
    last = state.messages_received
    if before == last + 1:
        cut = len(history)
    else:
        turn = next((t for t in ended if t.number == before), None)
        if turn is None:
            raise NotFound(
                f"session {state.id} has no turn {before}: fork at a turn from 1 to {last}, "
                f"or at {last + 1} to keep the whole history",
                session_id=state.id,
                turn=before,
            )
        cut = turn.history_start
    kept = history[:cut]
    forked = SessionState(
        id=new_id,
        agent=state.agent,
        created_at=now,
        tenant=state.tenant,
        priority=state.priority,
        messages_received=before - 1,
        history_length=cut,
        forked_from=ForkedFrom(session_id=state.id, turn=before),
        budget=state.budget,  # the same limit; its usage counts its own model calls
    )
    summaries = [i for i, item in enumerate(kept) if isinstance(item, SummaryItem)]
    if summaries:
        # the latest kept summary replaced what came before the turn it was made in
        forked.summary_at = summaries[-1]
        forked.context_start = max(
            t.history_start for t in ended if t.history_start <= forked.summary_at
        )
    forked.context_chars = sum(item_size(item) for item in forked.context(kept))
    return forked, kept, [t for t in ended if t.number < before]

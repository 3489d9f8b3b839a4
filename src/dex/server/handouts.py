"""The ``step`` message of the Worker protocol: what a Worker is handed for an attempt.

Built as the ``step`` struct of ``dex.wire.server_frames`` (the outbox encodes it with
msgspec; the Worker decodes it with the same struct): the history's
items were serialized once, when they were appended, and a RunModel hand-out carries
only the items of the model's view that the Worker's connection was not sent before
(``history_base``), so its cost follows the new items, not the conversation.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dex.server.dispatch.dispatcher import WorkerConn
from dex.server.engine.state import SessionState, Step
from dex.wire import StepType, server_frames


def step_message(
    state: SessionState,
    history_json: list[dict[str, Any]],
    step: Step,
    aid: str,
    worker: WorkerConn,
    traceparent: str | None = None,
) -> server_frames.Step:
    """The hand-out of ``step``'s latest attempt (``aid``) to ``worker``."""
    what: dict[str, Any]  # the model's view, or the tool call
    if step.type in (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT):
        base, context = (
            _context_for(worker, state, history_json)
            if step.type == StepType.RUN_MODEL
            else (0, state.to_compact(history_json))
        )
        what = {"history": msgspec.Raw(_HISTORY.encode(context)), "history_base": base}
    else:
        assert state.turn is not None and step.tool_call_id is not None
        call = state.turn.tool_call(step.tool_call_id)
        assert call is not None
        what = {
            "tool": call.name,
            "call_id": call.id,
            "arguments": call.arguments,
            "idempotency_key": call.idempotency_key,
            "needs_start_ack": step.type == StepType.CALL_SINGLE_ATTEMPT_TOOL,
            "answers": call.answers,
            "sleeps_done": call.sleeps_done,
            "task_handle": call.task_handle,
        }
    return server_frames.Step(
        attempt_id=aid,
        session_id=state.id,
        step_id=step.id,
        step_type=step.type,
        attempt=step.attempts[-1].number,
        agent=state.agent,
        traceparent=traceparent,
        **what,
    )


_HISTORY = msgspec.json.Encoder()
"""Encodes the history a hand-out carries (the frame embeds its JSON as it is)."""


def _context_for(
    worker: WorkerConn, state: SessionState, history: list[dict[str, Any]]
) -> tuple[int, list[dict[str, Any]]]:
    """What a RunModel hand-out to ``worker`` carries of the model's view of the history:
    (how many items the Worker has from the last hand-out on this connection, the rest).
    The cost is the new items, not the conversation's length."""
    shape = (state.context_start, state.summary_at)
    length = len(history)
    sent = worker.history_sent.get(state.id) if worker.history_cache else None
    if sent is not None and sent[0] == shape and sent[1] <= length:
        base = sent[2]
        tail = [history[i] for i in range(sent[1], length) if i != state.summary_at]
    else:
        base, tail = 0, state.context(history)
    if worker.history_cache:
        worker.history_sent[state.id] = (shape, length, base + len(tail))
        worker.history_sent.move_to_end(state.id)
        while len(worker.history_sent) > worker.history_cache:
            worker.history_sent.popitem(last=False)
    return base, tail

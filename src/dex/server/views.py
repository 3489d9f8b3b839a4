"""Read views the API renders: plain data built from a session's state and the dispatcher,
with no effect on either.

The engine's records that these views hold are re-exported here, for the layers above the
domain: the API documents a ``Turn``, its ``Step`` and ``ToolCall`` records and the
statuses (``dex.server.api.models``), the console reads a Step's terminal statuses and an
attempt's id, and neither imports the engine (the layer rules: README, Layout). They are
the engine's own types, not copies: the domain hands these very records out, so naming
them where its reads live is the simplest shape that keeps the OpenAPI document following
them when they change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.dispatch.limits import Blocked
from dex.server.engine.budget import Budget as Budget
from dex.server.engine.budget import Usage
from dex.server.engine.state import TERMINAL_STEP as TERMINAL_STEP
from dex.server.engine.state import FleetStatus as FleetStatus
from dex.server.engine.state import ForkedFrom as ForkedFrom
from dex.server.engine.state import QueuedMessage as QueuedMessage
from dex.server.engine.state import SessionState as SessionState
from dex.server.engine.state import Step as Step
from dex.server.engine.state import ToolCall as ToolCall
from dex.server.engine.state import Turn as Turn
from dex.server.engine.state import TurnStatus as TurnStatus
from dex.server.engine.state import attempt_id as attempt_id
from dex.wire import AgentSpec, StepType


def plain(record: Any) -> Any:
    """An engine record (a msgspec struct, or a list of them) as plain JSON data."""
    return msgspec.to_builtins(record)


def _waiting_for(step: Step, serving: bool) -> str:
    """What a queued Step waits for, in words."""
    if step.not_before and step.rate_limited:
        return "the model provider's rate limit"
    if step.not_before:
        return "backoff"
    return "a free Worker" if serving else "a Worker that serves " + step.queue


def plain_blocked(blocked: Blocked) -> dict[str, Any]:
    return {"key": blocked.key, "limit": blocked.limit, "until": blocked.until}


def snapshot(
    state: SessionState,
    history: list[dict[str, Any]],
    ended: list[Turn],
    dispatcher: Dispatcher,
) -> dict[str, Any]:
    """What ``get_agent_snapshot`` answers: the session, its current turn with every Step
    and attempt, what it waits for, what runs, the history, and every tool call."""
    waiting = []
    for step in state.queued_steps():
        serving = any(step.queue in w.queues for w in dispatcher.workers.values())
        blocked = dispatcher.limits.blocked(state.id, step.id)
        waiting.append(
            {
                "step_id": step.id,
                "queue": step.queue,
                "not_before": step.not_before or (blocked and blocked.until),
                "waiting_for": blocked.words() if blocked else _waiting_for(step, serving),
                "limit": plain_blocked(blocked) if blocked else None,
            }
        )
    return {
        "session": {
            **session_row(state),
            "last_turn_status": state.last_turn_status,
            "messages_received": state.messages_received,
            "priority": state.priority,
            "queued_messages": plain(state.queued),
            "forked_from": plain(state.forked_from) if state.forked_from else None,
            "budget": plain(state.budget) if state.budget else None,
        },
        "current_turn": plain(state.turn) if state.turn else None,
        "waiting": waiting,
        "waits": [
            {
                "step_id": step.id,
                "type": step.type.value,
                "call_id": step.tool_call_id,
                "since": step.wait.since if step.wait else step.created_at,
                "deadline": step.wait.deadline if step.wait else None,
                "question": step.wait.question if step.wait else None,
                "choices": step.wait.choices if step.wait else None,
                "reason": step.wait.reason if step.wait else None,
                "resolution_recorded": any(e["step_id"] == step.id for e in state.inbox),
            }
            for step in state.waiting_steps()
        ],
        "approvals": pending_approvals(state),
        "running": [
            {"attempt_id": aid, "worker_id": held.worker_id, "output_chars": held.output}
            for aid, held in dispatcher.held.items()
            if held.session_id == state.id
        ],
        "history": list(history),
        "tool_calls": [
            {"turn": turn.number, **plain(call)}
            for turn in [*ended, *filter(None, [state.turn])]
            for call in turn.tool_calls
        ],
    }


def session_row(state: SessionState) -> dict[str, Any]:
    """A session as the API lists it (the same columns the store keeps for the list)."""
    return {
        "id": state.id,
        "agent": state.agent,
        "tenant": state.tenant,
        "status": state.fleet_status().value,
        "created_at": state.created_at,
        "updated_at": state.updated_at or state.created_at,
        "waiting_since": state.waiting_since(),
        "outcome_unknown": state.outcome_unknown(),
        "usage": usage(state.usage),
    }


def usage(used: Usage) -> dict[str, Any]:
    """A session's usage as the API shows it (the list's columns)."""
    return {
        "input_tokens": used.input_tokens,
        "output_tokens": used.output_tokens,
        "cost_usd": used.cost_usd,
    }


WAIT_KIND = {
    StepType.AWAIT_TOOL_APPROVAL: "approval",
    StepType.AWAIT_QUESTION_ANSWER: "question",
    StepType.AWAIT_BUDGET: "budget",
}


def person_waits(state: SessionState) -> list[dict[str, Any]]:
    """What the session's turn waits for a person to do: approve (or deny) a tool call,
    answer the question a tool asked (each with the call it is about), or raise the
    session's budget (with the budget and what is used of it)."""
    turn = state.turn
    found = []
    for step in state.person_waits():
        if step.type == StepType.AWAIT_BUDGET and turn is not None:
            found.append(budget_wait(state, turn, step))
            continue
        call = turn.tool_call(step.tool_call_id or "") if turn is not None else None
        if turn is None or call is None:
            continue
        found.append(
            {
                "session_id": state.id,
                "agent": state.agent,
                "turn": turn.number,
                "call_id": call.id,
                "step_id": step.id,
                "kind": WAIT_KIND[step.type],
                "tool": call.name,
                "arguments": call.arguments,
                "arguments_hash": call.arguments_hash,
                "question": step.wait.question if step.wait else None,
                "choices": step.wait.choices if step.wait else None,
                "since": step.wait.since if step.wait else step.created_at,
            }
        )
    return found


def budget_wait(state: SessionState, turn: Turn, step: Step) -> dict[str, Any]:
    """A turn's wait for a bigger budget, as the inbox lists it: its session's budget, or
    (``tenant`` set) its tenant's."""
    return {
        "session_id": state.id,
        "agent": state.agent,
        "turn": turn.number,
        "call_id": "",
        "step_id": step.id,
        "kind": "budget",
        "tool": "",
        "arguments": {},
        "arguments_hash": "",
        "question": None,
        "choices": None,
        "since": step.wait.since if step.wait else step.created_at,
        "reason": step.wait.reason if step.wait else None,
        "tenant": step.wait.tenant if step.wait else None,
        "budget": plain(state.budget) if state.budget else None,
        "usage": usage(state.usage),
    }


def pending_approvals(state: SessionState) -> list[dict[str, Any]]:
    """The tool calls that wait for a person's approval (and none is recorded yet)."""
    return [
        {k: w[k] for k in ("call_id", "tool", "arguments", "arguments_hash", "since")}
        for w in person_waits(state)
        if w["kind"] == "approval"
    ]


def workers(dispatcher: Dispatcher, agents: Mapping[str, AgentSpec]) -> list[dict[str, Any]]:
    """The connected Workers: the agents and tools each serves, its capacity, what it runs."""
    found = []
    for conn in dispatcher.workers.values():
        found.append(
            {
                "worker_id": conn.id,
                "connected_at": conn.connected_at,
                "capacity": conn.capacity,
                "draining": conn.draining,
                "agents": [
                    {"name": name, "tools": [t.name for t in spec.tools] if spec else []}
                    for name in conn.agents
                    for spec in [agents.get(name)]
                ],
                "running": sorted(conn.attempts),
            }
        )
    return sorted(found, key=lambda w: w["worker_id"])

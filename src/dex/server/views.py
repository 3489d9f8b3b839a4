"""Read views the API renders: plain data built from a session's state and the dispatcher,
with no effect on either."""

from __future__ import annotations

from typing import Any

import msgspec

from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.engine.state import SessionState
from dex.wire import AgentSpec, StepType


def plain(record: Any) -> Any:
    """An engine record (a dataclass, or a list of them) as plain JSON data."""
    return msgspec.to_builtins(record)


def session_row(state: SessionState) -> dict[str, Any]:
    """A session as the API lists it (the same columns the store keeps for the list)."""
    return {
        "id": state.id,
        "agent": state.agent,
        "status": state.fleet_status().value,
        "created_at": state.created_at,
        "updated_at": state.updated_at or state.created_at,
        "waiting_since": state.waiting_since(),
        "outcome_unknown": state.outcome_unknown(),
    }


WAIT_KIND = {StepType.AWAIT_TOOL_APPROVAL: "approval", StepType.AWAIT_QUESTION_ANSWER: "question"}


def person_waits(state: SessionState) -> list[dict[str, Any]]:
    """What the session's turn waits for a person to do: approve (or deny) a tool call, or
    answer the question a tool asked; each with the call it is about."""
    turn = state.turn
    found = []
    for step in state.person_waits():
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


def pending_approvals(state: SessionState) -> list[dict[str, Any]]:
    """The tool calls that wait for a person's approval (and none is recorded yet)."""
    return [
        {k: w[k] for k in ("call_id", "tool", "arguments", "arguments_hash", "since")}
        for w in person_waits(state)
        if w["kind"] == "approval"
    ]


def workers(dispatcher: Dispatcher, agents: dict[str, AgentSpec]) -> list[dict[str, Any]]:
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

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


def pending_approvals(state: SessionState) -> list[dict[str, Any]]:
    """The tool calls that wait for a person's approval (and none is recorded yet)."""
    turn = state.turn
    found = []
    for step in state.waiting_steps():
        if step.type != StepType.AWAIT_TOOL_APPROVAL or turn is None:
            continue
        call = turn.tool_call(step.tool_call_id or "")
        if call is None or any(e["call_id"] == call.id for e in state.inbox):
            continue
        found.append(
            {
                "call_id": call.id,
                "tool": call.name,
                "arguments": call.arguments,
                "arguments_hash": call.arguments_hash,
                "since": step.wait.since if step.wait else step.created_at,
            }
        )
    return found


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

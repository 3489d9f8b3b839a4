"""Client routes: sessions, messages, turns, snapshots."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import Field

from dex.server.api.responses import ORJSONResponse
from dex.server.sessions import Sessions
from dex.wire import Wire

router = APIRouter(prefix="/v1", tags=["sessions"])


class CreateSession(Wire):
    agent: str = Field(min_length=1, max_length=128)
    session_id: str | None = Field(None, min_length=1, max_length=128)


class SendMessage(Wire):
    text: str = Field(min_length=1, max_length=1_000_000)
    message_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="A client-chosen id: sending the same id again returns the first turn.",
    )
    wait_seconds: float = Field(
        0,
        ge=0,
        le=3600,
        description="Hold the response until the turn ends, up to this long.",
    )


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def _turn_body(session_id: str, number: int, turn: Any) -> dict[str, Any]:
    if turn is None:
        return {"session_id": session_id, "turn": number, "status": "running"}
    return {
        "session_id": session_id,
        "turn": number,
        "status": turn.status.value,
        "text": turn.text,
        "error": turn.error,
        "tool_calls": [c.model_dump(mode="json") for c in turn.tool_calls],
        "steps": [s.model_dump(mode="json") for s in turn.steps],
        "started_at": turn.started_at,
        "ended_at": turn.ended_at,
    }


@router.post("/sessions", status_code=201)
async def create_session(body: CreateSession, request: Request) -> ORJSONResponse:
    state = await _sessions(request).create(body.agent, body.session_id)
    return ORJSONResponse(
        {
            "id": state.id,
            "agent": state.agent,
            "status": state.status.value,
            "created_at": state.created_at,
        },
        201,
    )


@router.get("/sessions")
async def list_sessions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: str | None = None,
) -> ORJSONResponse:
    rows = await _sessions(request).list_rows(limit, after)
    return ORJSONResponse({"sessions": [row.__dict__ for row in rows]})


@router.get("/sessions/{session_id}")
async def get_agent_snapshot(session_id: str, request: Request) -> ORJSONResponse:
    sessions = _sessions(request)
    snapshot = await sessions.snapshot(session_id)
    snapshot["tool_calls"] = await _every_tool_call(sessions, snapshot)
    return ORJSONResponse(snapshot)


async def _every_tool_call(sessions: Sessions, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool call of the session, oldest first, each with its turn number: those of
    the ended turns (from the turn archive) and then those of the current turn."""
    session = snapshot["session"]
    current = snapshot["current_turn"]
    not_ended = {m["number"] for m in session["queued_messages"]}
    if current is not None:
        not_ended.add(current["number"])
    numbers = [n for n in range(1, session["messages_received"] + 1) if n not in not_ended]
    ended = await asyncio.gather(*(sessions.wait_turn(session["id"], n, 0) for n in numbers))
    calls: list[dict[str, Any]] = []
    for turn in ended:
        if turn is not None:
            calls.extend(
                {"turn": turn.number, **c.model_dump(mode="json")} for c in turn.tool_calls
            )
    if current is not None:
        calls.extend({"turn": current["number"], **c} for c in current["tool_calls"])
    return calls


@router.post("/sessions/{session_id}/messages")
async def send_message(session_id: str, body: SendMessage, request: Request) -> ORJSONResponse:
    sessions = _sessions(request)
    number, created = await sessions.send(session_id, body.text, body.message_id)
    turn = None
    if body.wait_seconds > 0:
        wait = min(body.wait_seconds, request.app.state.config.max_wait_seconds)
        turn = await sessions.wait_turn(session_id, number, wait)
    result = _turn_body(session_id, number, turn)
    result["created"] = created
    return ORJSONResponse(result, 201 if created else 200)


@router.get("/sessions/{session_id}/turns/{number}")
async def get_turn(
    session_id: str,
    number: int,
    request: Request,
    wait_seconds: Annotated[float, Query(ge=0, le=3600)] = 0,
) -> ORJSONResponse:
    sessions = _sessions(request)
    wait = min(wait_seconds, request.app.state.config.max_wait_seconds)
    turn = await sessions.wait_turn(session_id, number, wait)
    return ORJSONResponse(_turn_body(session_id, number, turn))


@router.get("/agents", tags=["agents"])
async def list_agents(request: Request) -> ORJSONResponse:
    agents = _sessions(request).agents.values()
    return ORJSONResponse({"agents": [a.model_dump(mode="json") for a in agents]})

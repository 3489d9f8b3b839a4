"""Client routes: sessions, messages, turns, snapshots."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import ORJSONResponse
from pydantic import Field

from dex.server.sessions import Sessions
from dex.wire import Wire

router = APIRouter(prefix="/v1", tags=["sessions"])


class CreateSession(Wire):
    agent: str = Field(min_length=1, max_length=128)
    session_id: str | None = Field(None, min_length=1, max_length=128)


class SendMessage(Wire):
    text: str = Field(min_length=1, max_length=1_000_000)
    message_id: str | None = Field(
        None, min_length=1, max_length=128,
        description="A client-chosen id: sending the same id again returns the first turn.",
    )
    wait_seconds: float = Field(
        0, ge=0, le=3600,
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
        "started_at": turn.started_at,
        "ended_at": turn.ended_at,
    }


@router.post("/sessions", status_code=201)
async def create_session(body: CreateSession, request: Request) -> ORJSONResponse:
    state = await _sessions(request).create(body.agent, body.session_id)
    return ORJSONResponse(
        {"id": state.id, "agent": state.agent, "status": state.status.value,
         "created_at": state.created_at},
        201,
    )


@router.get("/sessions")
async def list_sessions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: str | None = None,
) -> ORJSONResponse:
    rows = await _sessions(request).list(limit, after)
    return ORJSONResponse({"sessions": [row.__dict__ for row in rows]})


@router.get("/sessions/{session_id}")
async def get_agent_snapshot(session_id: str, request: Request) -> ORJSONResponse:
    return ORJSONResponse(await _sessions(request).snapshot(session_id))


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

"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from dex.server.api import models
from dex.server.api.models import errors
from dex.server.api.responses import ORJSONResponse

router = APIRouter(tags=["operations"], responses=errors(500))


@router.get("/healthz", response_model=models.Health)
async def healthz() -> ORJSONResponse:
    return ORJSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    response_model=models.Readiness,
    responses={503: {"model": models.Readiness, "description": "The node is starting."}},
)
async def readyz(request: Request) -> ORJSONResponse:
    if request.app.state.ready:
        return ORJSONResponse({"status": "ready", "role": "active"})
    return ORJSONResponse({"status": "starting"}, 503)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **errors(401, 403),
    },
)
async def metrics(request: Request) -> PlainTextResponse:
    state = request.app.state
    dispatcher = state.dispatcher
    store = state.store
    lines = [
        "# TYPE dex_store_commits_total counter",
        f"dex_store_commits_total {getattr(store, 'commits', 0)}",
        "# TYPE dex_store_operations_total counter",
        f"dex_store_operations_total {getattr(store, 'operations', 0)}",
        "# TYPE dex_workers_connected gauge",
        f"dex_workers_connected {len(dispatcher.workers)}",
        "# TYPE dex_attempts_running gauge",
        f"dex_attempts_running {len(dispatcher.held)}",
    ]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

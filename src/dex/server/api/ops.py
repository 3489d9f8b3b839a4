"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from dex.server.api.responses import ORJSONResponse

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> ORJSONResponse:
    return ORJSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> ORJSONResponse:
    node = request.app.state.node
    role = node.role if node is not None else "starting"
    if role == "active":
        return ORJSONResponse({"status": "ready", "role": role, "epoch": node.epoch})
    return ORJSONResponse({"status": "not ready", "role": role}, 503)


@router.get("/metrics")
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
        "# TYPE dex_worker_messages_refused_total counter",
        f"dex_worker_messages_refused_total {dispatcher.refused}",
        "# TYPE dex_background_retries_total counter",
        f"dex_background_retries_total {state.sessions.background_failures}",
    ]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
